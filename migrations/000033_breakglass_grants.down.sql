DROP TABLE IF EXISTS breakglass_grants;
