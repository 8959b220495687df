-- Ids made inside PostgreSQL: valka_uuid7().
--
-- Time-sortable ids generated inside PostgreSQL (version 7: a 48-bit millisecond
-- timestamp over a random v4 UUID, version nibble set to 7), for rows that SQL
-- statements insert without a round trip to Python.

CREATE OR REPLACE FUNCTION valka_uuid7() RETURNS uuid AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$ LANGUAGE sql VOLATILE PARALLEL SAFE;
