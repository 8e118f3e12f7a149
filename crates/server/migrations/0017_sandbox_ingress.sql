-- How the proxy talks to a sandbox's ports (JSON: `maskRequestHost`, `httpsPorts` of the create
-- body's `network`); NULL for the defaults.
ALTER TABLE sandboxes ADD COLUMN ingress TEXT;
