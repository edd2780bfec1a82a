DROP TABLE IF EXISTS service_grants;
DROP SEQUENCE IF EXISTS view_versions;
