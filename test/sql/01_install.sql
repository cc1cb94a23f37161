-- Install into a schema of its own, as an application would.
CREATE SCHEMA ob;
CREATE EXTENSION outbox SCHEMA ob;
SELECT extname, extversion, extrelocatable, n.nspname
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
 WHERE extname = 'outbox';

-- Every object is in the extension's schema.  The types a table, a view or
-- a type brings with it (its row type, its array type), which PostgreSQL 17
-- records as members as well, go with it and are not listed.
SELECT pg_describe_object(d.classid, d.objid, d.objsubid) AS object
  FROM pg_depend d
  LEFT JOIN pg_type t ON d.classid = 'pg_type'::regclass AND t.oid = d.objid
  LEFT JOIN pg_class c ON c.oid = t.typrelid
 WHERE d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox')
   AND d.deptype = 'e'
   AND NOT coalesce(c.relkind <> 'c' OR t.typcategory = 'A', false)
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
