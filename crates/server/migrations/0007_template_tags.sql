-- Template tags (E2B's `name:tag`): each names one build of a template. `build(tags=[...])` sets them
-- when the build is ready (`default` when none are given), `POST /templates/tags` copies a tag's build
-- to more tags, `DELETE /templates/tags` removes them; `Sandbox.create("name:tag")` resolves here.
CREATE TABLE template_tags (
    template_id TEXT NOT NULL,
    tag TEXT NOT NULL,
    build_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (template_id, tag)
);
