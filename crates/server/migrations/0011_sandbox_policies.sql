-- A sandbox's own monitor policies (create body `policies`, over the server's defaults): JSON as the
-- API takes it; NULL for none. Part of the sandbox so they follow it through pause, resume and fork.
ALTER TABLE sandboxes ADD COLUMN policies TEXT;
