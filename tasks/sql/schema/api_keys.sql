-- What a process that remembers live API keys (tasks/api/live_keys.py) must hear: a key revoked,
-- given another scope, name or hash, or deleted, and the table truncated. The key's hash (before
-- the change) goes out on valka_api_key_changed at commit; '*' when the table is truncated.
-- The once-a-minute write of last_used_at (tasks.api.auth.note_use) sends nothing.
--
-- The comparison is in the function's body, not in the trigger's WHEN: a trigger is checked when
-- migration 0013 applies these files, before migration 0017 adds the column `scope`.

CREATE OR REPLACE FUNCTION valka_api_key_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_notify('valka_api_key_changed', '*');
    ELSIF TG_OP = 'DELETE' OR OLD.revoked IS DISTINCT FROM NEW.revoked OR OLD.scope IS DISTINCT FROM NEW.scope
          OR OLD.name IS DISTINCT FROM NEW.name OR OLD.key_hash IS DISTINCT FROM NEW.key_hash THEN
        PERFORM pg_notify('valka_api_key_changed', OLD.key_hash);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE TRIGGER api_keys_changed AFTER UPDATE OR DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION valka_api_key_changed();

CREATE OR REPLACE TRIGGER api_keys_truncated AFTER TRUNCATE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION valka_api_key_changed();
