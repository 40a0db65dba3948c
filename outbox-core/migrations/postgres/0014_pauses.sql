-- Pauses an operator set on a handler or a topic (`outbox pause`, `Store::pause`). Workers read
-- this small table twice a second: a paused topic, or one whose handlers are all paused, is
-- left out of their claims; a message of a topic with some handlers paused runs its other
-- handlers and is then parked (`parked_by`), pending, its attempt not counted, until the
-- handler is resumed. A pause with `until` ends by itself then.
CREATE TABLE outbox_pauses (
    scope     TEXT        NOT NULL CHECK (scope IN ('handler', 'topic')),
    name      TEXT        NOT NULL,
    paused_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    until     TIMESTAMPTZ,                      -- NULL: until resumed
    paused_by TEXT        NOT NULL,
    reason    TEXT,
    PRIMARY KEY (scope, name)
);

-- The paused handler a message waits for: claims skip the row while it is set, and a keyed
-- message parked here still holds its key. No default: adding the column rewrites no row.
ALTER TABLE outbox_messages ADD COLUMN parked_by TEXT;
CREATE INDEX outbox_messages_parked_idx ON outbox_messages (parked_by) WHERE parked_by IS NOT NULL;
