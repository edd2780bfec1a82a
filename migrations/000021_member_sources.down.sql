DROP TABLE member_sources;
