//! The one migration runner's plan, shared by both backends: which embedded migrations a
//! database still needs, and whether its recorded ones belong to this build. Each backend only
//! takes its lock, reads `outbox_migrations` and runs the SQL the plan names.

use crate::error::{Error, Result};

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Migration {
    pub(crate) version: i64,
    pub(crate) description: &'static str,
    pub(crate) sql: &'static str,
}

impl Migration {
    /// A stable checksum of the SQL (FNV-1a), to detect a migration edited after release.
    pub(crate) fn checksum(&self) -> i64 {
        i64::from_ne_bytes(fnv1a(self.sql.as_bytes()).to_ne_bytes())
    }
}

/// The migrations of `embedded` that are not among the `applied` (version, checksum) pairs, in
/// order.
///
/// # Errors
///
/// [`Error::MigrationUnknown`] when the database records a version this build does not have
/// (a newer build migrated it), [`Error::MigrationChanged`] when an applied migration's SQL
/// differs from this build's.
pub(crate) fn pending<'a>(
    embedded: &'a [Migration],
    applied: &[(i64, i64)],
) -> Result<Vec<&'a Migration>> {
    for &(version, sum) in applied {
        match embedded.iter().find(|m| m.version == version) {
            None => return Err(Error::MigrationUnknown { version }),
            Some(m) if m.checksum() != sum => return Err(Error::MigrationChanged { version }),
            Some(_) => {}
        }
    }
    Ok(embedded
        .iter()
        .filter(|m| applied.iter().all(|&(v, _)| v != m.version))
        .collect())
}

/// FNV-1a, 64 bits: a stable hash of a migration's SQL (the same on every build and platform).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMBEDDED: &[Migration] = &[
        Migration {
            version: 1,
            description: "one",
            sql: "CREATE TABLE a (x int)",
        },
        Migration {
            version: 2,
            description: "two",
            sql: "CREATE TABLE b (x int)",
        },
    ];

    #[test]
    fn a_new_database_needs_every_migration_in_order() {
        let plan = pending(EMBEDDED, &[]).unwrap();
        assert_eq!(plan.iter().map(|m| m.version).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn applied_migrations_are_skipped() {
        let plan = pending(EMBEDDED, &[(1, EMBEDDED[0].checksum())]).unwrap();
        assert_eq!(plan.iter().map(|m| m.version).collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn an_edited_migration_is_refused() {
        let err = pending(EMBEDDED, &[(1, 42)]).unwrap_err();
        assert!(
            matches!(err, Error::MigrationChanged { version: 1 }),
            "{err}"
        );
    }

    #[test]
    fn a_version_this_build_does_not_know_is_refused() {
        let applied = [(1, EMBEDDED[0].checksum()), (3, 7)];
        let err = pending(EMBEDDED, &applied).unwrap_err();
        assert!(
            matches!(err, Error::MigrationUnknown { version: 3 }),
            "{err}"
        );
    }
}
