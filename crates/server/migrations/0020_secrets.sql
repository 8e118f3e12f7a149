-- Stored secrets (E2B's /secrets): a team's named values, sealed with the operator's key
-- (ChaCha20-Poly1305, the row's id and version as associated data). The plaintext is never stored.
CREATE TABLE secrets (
    id          TEXT PRIMARY KEY,
    team_id     TEXT NOT NULL,
    name        TEXT NOT NULL,     -- lower-cased
    version     INTEGER NOT NULL,  -- of the value; the sealed value belongs to it
    nonce       BLOB NOT NULL,
    ciphertext  BLOB NOT NULL,     -- value and authentication tag
    metadata    TEXT NOT NULL,     -- JSON object of strings
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    UNIQUE (team_id, name)
);
CREATE INDEX secrets_team_created ON secrets (team_id, created_at, id);
