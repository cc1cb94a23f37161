-- Install into a schema of its own, as an application would.
CREATE SCHEMA ob;
CREATE EXTENSION outbox SCHEMA ob;
SELECT extname, extversion, extrelocatable, n.nspname
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
 WHERE extname = 'outbox';

-- Every object is in the extension's schema.
SELECT pg_describe_object(classid, objid, objsubid) AS object
  FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox')
   AND deptype = 'e'
 ORDER BY 1;

-- Not relocatable.
ALTER EXTENSION outbox SET SCHEMA public;

-- Drop removes everything, and it installs again.
DROP EXTENSION outbox;
SELECT count(*) AS leftovers FROM pg_class WHERE relnamespace = 'ob'::regnamespace;
CREATE EXTENSION outbox SCHEMA ob;

-- Hot tables carry deliberate autovacuum settings.
SELECT relname, reloptions FROM pg_class
 WHERE relnamespace = 'ob'::regnamespace AND relkind = 'r' ORDER BY relname;
