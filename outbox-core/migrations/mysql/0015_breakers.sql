-- Circuit breakers per handler, as on PostgreSQL; times in milliseconds since the epoch.
CREATE TABLE outbox_breakers (
    handler       VARCHAR(255) NOT NULL,
    `open`        BOOLEAN      NOT NULL,
    failures      INT          NOT NULL,
    repeats       INT          NOT NULL DEFAULT 0,
    window_start  BIGINT       NOT NULL,
    opened_at     BIGINT       NULL,
    probe_at      BIGINT       NULL,
    failed_probes INT          NOT NULL DEFAULT 0,
    probe_by      CHAR(36)     NULL,
    last_error    TEXT         NULL,
    PRIMARY KEY (handler)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
