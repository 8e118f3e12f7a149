-- Two details of an event, for the dashboard's fleet view:
-- took_ms: on the event that ends a create (creating -> running), resume (resuming -> running) or pause
--   (pausing -> paused), how long the operation took since its in-between state was entered;
-- policy: on a note a fleet-hygiene check recorded (runaway_cpu, oom_kill, memory_pressure, disk_full,
--   orphans, reconciler), which one.
ALTER TABLE sandbox_events ADD COLUMN took_ms INTEGER;
ALTER TABLE sandbox_events ADD COLUMN policy TEXT;
-- Both are read newest first over a few rows among many: partial indexes hold only those rows.
CREATE INDEX sandbox_events_took ON sandbox_events (at) WHERE took_ms IS NOT NULL;
CREATE INDEX sandbox_events_policy ON sandbox_events (seq) WHERE policy IS NOT NULL;
