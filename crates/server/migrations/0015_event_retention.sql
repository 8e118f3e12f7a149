-- Events older than the event retention are deleted by the monitor; this finds them without a scan.
-- (seq is AUTOINCREMENT: deleting the newest never lets a number be handed out twice, so webhook
-- cursors and `after=` stay right.)
CREATE INDEX sandbox_events_at ON sandbox_events (at);
