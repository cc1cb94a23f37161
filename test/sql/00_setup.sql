-- Helpers the other files share.  pg_regress runs each file in a session of
-- its own, in one database and in name order, so they live in a schema
-- made here, first (a pg_temp function would end with its file's session).
CREATE SCHEMA regress;
-- the test roles of 05_hardening.sql call them too
GRANT USAGE ON SCHEMA regress TO PUBLIC;

-- A statement's outcome: 'ok', or the error's SQLSTATE, message, detail and
-- hint (run as the caller, with the caller's search_path).
CREATE FUNCTION regress.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	st text; msg text; det text; hnt text;
BEGIN
	EXECUTE stmt;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
		det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
	RETURN st || ': ' || msg || coalesce(E'\n  DETAIL: ' || nullif(det, ''), '')
		|| coalesce(E'\n  HINT: ' || nullif(hnt, ''), '');
END
$$;
