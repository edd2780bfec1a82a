DROP TABLE IF EXISTS published_views;

-- view_versions comes back above every version an epoch handed out (every
-- epoch below the sequence's next value, each up to 2^32 versions), so a
-- rolled-back control plane never publishes a version a client has passed.
CREATE SEQUENCE view_versions INCREMENT BY 1000 MINVALUE 1 START WITH 1;
SELECT setval('view_versions',
    (SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM publisher_epochs) << 32, false);

DROP SEQUENCE IF EXISTS publisher_epochs;
