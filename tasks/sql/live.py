"""The statements of a process's LISTEN connection for task events (tasks.live)."""

# -- This session watches task events: the event triggers build and send them while a watcher
# exists (tasks/sql/schema/events.sql); pruning the dead watchers of earlier sessions first. A
# watcher is a server process, so this runs on a session of its own, never through a pooler. --
WATCH_EVENTS = "SELECT valka_task_events_watch()"

# -- This session stops watching (it is about to close its LISTEN connection). --
UNWATCH_EVENTS = "SELECT valka_task_events_unwatch()"
