"""The scheduler: the background loops that move tasks forward in time.

One module per loop (retry engine, lease reaper, delayed promoter, worker
janitor, retention), all of the shape in `base.Loop`; `leader` elects the
one scheduler that acts; `runner` runs them all in one process
(`manage.py run_scheduler`). Their SQL is in `tasks.sql.maintenance`.
"""
