-- Wakes the scheduler's firing loop (schedules/firing.py) when a schedule may be due sooner than
-- the loop planned for: one is added or enabled, or its next slot moves earlier. The loop then
-- reads the earliest next_run_at again instead of sleeping until its poll. The loop's own
-- advances always move next_run_at later, so they wake nobody, and the WHEN clauses keep every
-- other change (most of the loop's updates) from calling the function at all.

CREATE OR REPLACE FUNCTION valka_schedules_changed() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('valka_schedules_changed', '');
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE OR REPLACE TRIGGER schedules_changed_insert AFTER INSERT ON schedules
FOR EACH ROW WHEN (NEW.enabled AND NEW.next_run_at IS NOT NULL)
EXECUTE FUNCTION valka_schedules_changed();

CREATE OR REPLACE TRIGGER schedules_changed_update AFTER UPDATE OF enabled, next_run_at ON schedules
FOR EACH ROW WHEN (NEW.enabled AND NEW.next_run_at IS NOT NULL
                   AND (NOT OLD.enabled OR OLD.next_run_at IS NULL OR NEW.next_run_at < OLD.next_run_at))
EXECUTE FUNCTION valka_schedules_changed();
