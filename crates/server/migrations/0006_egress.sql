-- A sandbox's egress rules by address (network.allowOut / denyOut): JSON {"allow": [...], "deny":
-- [...]} of CIDRs; NULL for none. Part of the sandbox so they follow it through pause, resume and
-- fork.
ALTER TABLE sandboxes ADD COLUMN egress TEXT;
