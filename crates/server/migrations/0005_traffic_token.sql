-- A private sandbox (network.allowPublicTraffic = false): the proxy lets requests to its user ports
-- through only with this token in the e2b-traffic-access-token header. NULL: public.
ALTER TABLE sandboxes ADD COLUMN traffic_access_token TEXT;
