DROP TABLE IF EXISTS rate_limit_attempts;
DROP TABLE IF EXISTS overrides;
