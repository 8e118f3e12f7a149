-- The monitor's samples also keep page cache (memCache) and the bytes a sandbox received and sent
-- on its link since it was started or restored.
ALTER TABLE sandbox_metrics ADD COLUMN mem_cache INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandbox_metrics ADD COLUMN net_rx INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandbox_metrics ADD COLUMN net_tx INTEGER NOT NULL DEFAULT 0;
