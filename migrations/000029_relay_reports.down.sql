DROP TABLE IF EXISTS relay_reports;
