-- Web UI sessions (issue 7), kept in PostgreSQL so every replica sees the
-- same sessions. The layout is the one github.com/alexedwards/scs's
-- postgresstore reads and writes: an opaque token, the encoded session and
-- its absolute expiry. Expired rows are deleted by the store's cleanup.
CREATE TABLE sessions (
    token  text PRIMARY KEY,
    data   bytea NOT NULL,
    expiry timestamptz NOT NULL
);

CREATE INDEX sessions_expiry_idx ON sessions (expiry);
