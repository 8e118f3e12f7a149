-- A template's monitor policies (JSON, the create body's `policies` shape): every sandbox made from
-- it starts with them, its own create-time fields over them. Set with PATCH /templates/{id}; a
-- rebuild keeps them.
ALTER TABLE templates ADD COLUMN policies TEXT NOT NULL DEFAULT '{}';
