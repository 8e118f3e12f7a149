-- What a sandbox's auto-pause at timeout keeps: 1 its memory (a CRIU checkpoint, the default), 0 its
-- files only (`lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}}`).
ALTER TABLE sandboxes ADD COLUMN auto_pause_memory INTEGER NOT NULL DEFAULT 1;
