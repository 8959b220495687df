from django.core.management.base import BaseCommand, CommandError

from valka_sdk.django.runner import build_worker


class Command(BaseCommand):
    help = ("Run the project's @task functions from Valka: one gRPC stream to the dispatcher, until "
            "SIGTERM or SIGINT, then drain. The worker token comes from the backend's OPTIONS "
            "(WORKER_TOKEN) or VALKA_WORKER_TOKEN, never from the command line.")

    def add_arguments(self, parser):
        parser.add_argument("--queue", action="append", dest="queues", help="a queue to take (repeatable; "
                            "default: the backend's QUEUES)")
        parser.add_argument("--concurrency", type=int, default=8, help="tasks run at once (default 8)")
        parser.add_argument("--backend", default="default", help="the TASKS alias (default: default)")
        parser.add_argument("--name", help="the worker's name in the admin (default: host and a random suffix)")
        parser.add_argument("--worker-id", help="its id; with mutual TLS, its certificate's common name")
        parser.add_argument("--dispatcher", help="host:port[,host:port] (default: OPTIONS['DISPATCHER'])")
        parser.add_argument("--tls", action="store_true", default=None, help="TLS checked against the system's roots")
        parser.add_argument("--tls-ca", help="TLS checked against this CA's PEM file (OPTIONS['TLS_CA_FILE'])")
        parser.add_argument("--tls-cert", help="mutual TLS: the worker's certificate (OPTIONS['TLS_CERT_FILE'])")
        parser.add_argument("--tls-key", help="mutual TLS: the worker's key (OPTIONS['TLS_KEY_FILE'])")

    def handle(self, *args, **options):
        try:
            worker = build_worker(
                backend_alias=options["backend"], queues=options["queues"], concurrency=options["concurrency"],
                name=options["name"], worker_id=options["worker_id"], dispatcher=options["dispatcher"],
                tls=options["tls"], tls_ca_file=options["tls_ca"], tls_cert_file=options["tls_cert"],
                tls_key_file=options["tls_key"])
        except (ValueError, OSError) as exc:
            raise CommandError(str(exc)) from exc
        worker.run()
