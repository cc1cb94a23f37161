-- Settings refuse values outside their range, with the setting's name and
-- its bounds, and names under the extension's prefix that it does not
-- define.  The words are PostgreSQL's: 17 gives both bounds their unit and
-- calls an undefined name under a reserved prefix invalid, hence
-- 09_setting_limits_1.out.
SET outbox.max_payload_bytes = -1;
ALTER SYSTEM SET outbox.batch_bytes = 100;
ALTER SYSTEM SET outbox.read_interval = '2s';
ALTER SYSTEM SET outbox.nonexistent = 1;
