DROP TABLE IF EXISTS history_samples;
