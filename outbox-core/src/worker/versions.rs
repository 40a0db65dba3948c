//! The versions of each topic a worker decodes, and the checks that its handlers agree on them.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::handler::ErasedHandler;

/// The highest version a topic served only by raw handlers is claimed up to: a raw handler
/// takes the stored payload of any version as it is.
const ANY_VERSION: i32 = i32::MAX;

/// Per topic, the highest version this worker's handlers decode; or, one sentence each, why
/// they cannot run together: handlers of a topic whose event types are of different versions
/// (the older could not decode what the newer lets the worker claim), or two types that claim
/// the same version of a topic.
pub(super) fn known_versions(
    topics: &BTreeMap<&'static str, Vec<Arc<dyn ErasedHandler>>>,
) -> Result<BTreeMap<&'static str, i32>, Vec<String>> {
    let mut problems = Vec::new();
    let mut known = BTreeMap::new();
    for (&topic, handlers) in topics {
        let typed: Vec<_> = handlers
            .iter()
            .filter_map(|h| Some((h, h.version()?, h.event_versions())))
            .collect();
        let mut versions = typed.iter().map(|(_, v, _)| *v);
        let Some(first) = versions.next() else {
            known.insert(topic, ANY_VERSION);
            continue;
        };
        if versions.any(|v| v != first) {
            let each: Vec<String> = typed
                .iter()
                .map(|(h, v, chain)| {
                    let type_name = chain.first().map_or("?", |(_, t)| *t);
                    format!("`{}` takes `{type_name}` (version {v})", h.name())
                })
                .collect();
            problems.push(format!(
                "handlers of topic `{topic}` decode different versions: {}; give them all the \
                 newest type, so the worker takes no version one of them cannot read",
                each.join(", ")
            ));
        }
        let mut claims: BTreeMap<u32, Vec<&'static str>> = BTreeMap::new();
        for (_, _, chain) in &typed {
            for &(version, type_name) in chain {
                let types = claims.entry(version).or_default();
                if !types.contains(&type_name) {
                    types.push(type_name);
                }
            }
        }
        for (version, types) in claims.into_iter().filter(|(_, t)| t.len() > 1) {
            problems.push(format!(
                "types {} both claim version {version} of topic `{topic}`: use one type per \
                 version (name it in `previous` of the next version) in every handler",
                types
                    .iter()
                    .map(|t| format!("`{t}`"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ));
        }
        known.insert(topic, i32::try_from(first).unwrap_or(ANY_VERSION));
    }
    if problems.is_empty() {
        Ok(known)
    } else {
        Err(problems)
    }
}
