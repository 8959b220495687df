"""What a task may be: the rules the server validates, written once here so that a client (the
Django backend) refuses bad input before it sends anything. The server's `tasks.specs` imports them."""

import re

# Every name the queue stores (task, queue, idempotency key, worker id and name, signal type) is
# at most MAX_NAME characters; a queue name also follows QUEUE_PATTERN.
MAX_NAME = 255
QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$"
QUEUE_RE = re.compile(QUEUE_PATTERN)
QUEUE_RULE = "may contain only letters, digits, '_', '-', '.', ':' and must start with a letter or digit"
MAX_RETRIES_LIMIT = 1000
TIMEOUT_RANGE = (1, 86400)
