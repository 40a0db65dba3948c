//! A worker binary that links a crate declaring an event (`fixture-events`) but not the crate
//! with its handler (`fixture-handlers`): the forgotten handler crate `run_worker` refuses.
//! Its own topic, `unlinked.own`, has a handler here, built from an [`OwnConfig`] resource
//! that the binary gives unless `UNLINKED_WORKER_WITHOUT_CONFIG` is set.

use std::process::ExitCode;

use fixture_events as _; // declares fixture.shipped; its handler crate is not linked
use outbox::{
    outbox_event, register_handler, Context, FromResources, Handler, HandlerError, ResourceError,
    Resources,
};
use serde::{Deserialize, Serialize};

/// This binary's own event.
#[outbox_event(topic = "unlinked.own")]
#[derive(Debug, Serialize, Deserialize)]
struct Own {
    n: i64,
}

/// What the handler of `unlinked.own` is built from.
struct OwnConfig;

struct OwnHandler;

#[outbox::async_trait]
impl Handler for OwnHandler {
    type Event = Own;
    const NAME: &'static str = "own";

    async fn handle(&self, _: Own, _: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

impl FromResources for OwnHandler {
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        resources.require::<OwnConfig>()?;
        Ok(OwnHandler)
    }
}

register_handler!(OwnHandler);

#[tokio::main]
async fn main() -> ExitCode {
    outbox::cli::run_worker(|_args, builder| {
        if std::env::var_os("UNLINKED_WORKER_WITHOUT_CONFIG").is_some() {
            builder
        } else {
            builder.resource(OwnConfig)
        }
    })
    .await
}
