-- Events of template-build sandboxes. They have no row in `sandboxes`, so their events carry their
-- team, template and build themselves; every other sandbox's events leave these NULL and are read
-- through `sandboxes` as before.
ALTER TABLE sandbox_events ADD COLUMN team_id TEXT;
ALTER TABLE sandbox_events ADD COLUMN template_id TEXT;
ALTER TABLE sandbox_events ADD COLUMN build_id TEXT;
