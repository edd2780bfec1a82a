DROP TABLE IF EXISTS stream_population;
