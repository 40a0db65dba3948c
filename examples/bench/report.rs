//! The report: one row per figure, its target and PASS/MISS, as a table or as JSON.

use serde::Serialize;

use crate::cpu::CpuPer;
use crate::workloads::Sample;

/// How a figure compares with its target.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Op {
    /// The figure must be at least the target.
    AtLeast,
    /// The figure must be at most the target.
    AtMost,
}

/// A figure's target.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Target {
    /// The comparison.
    pub(crate) op: Op,
    /// The bound, in the row's unit.
    pub(crate) value: f64,
}

impl Target {
    /// `figure >= value`.
    pub(crate) fn at_least(value: f64) -> Option<Target> {
        Some(Target {
            op: Op::AtLeast,
            value,
        })
    }

    /// `figure <= value`.
    pub(crate) fn at_most(value: f64) -> Option<Target> {
        Some(Target {
            op: Op::AtMost,
            value,
        })
    }

    fn met(self, figure: f64) -> bool {
        match self.op {
            Op::AtLeast => figure >= self.value,
            Op::AtMost => figure <= self.value,
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    /// `W1`..`W6`, `RSS`.
    pub(crate) id: &'static str,
    /// What was measured.
    pub(crate) name: String,
    /// The figure; `None` when the workload failed.
    pub(crate) value: Option<f64>,
    /// `msgs/s`, `tx/s`, `x`, `ms`, `MB`.
    pub(crate) unit: &'static str,
    /// The target, on PostgreSQL (and the few of MariaDB/MySQL's own, see
    /// [`Report::set_target`]); `None` where there is none.
    pub(crate) target: Option<Target>,
    /// Whether the target is met; `None` without a target or a figure.
    pub(crate) pass: Option<bool>,
    /// CPU microseconds per message (or transaction) behind a rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpu: Option<CpuPer>,
    /// The error of a failed workload, or a remark.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) note: Option<String>,
    /// Every run's figure, in the order run, where the figure is their median.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) runs: Option<Vec<f64>>,
}

/// The report of one backend.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    /// `postgres`, `sqlite` or `mysql`.
    pub(crate) backend: &'static str,
    /// Server or library version.
    pub(crate) server: String,
    /// The `--scale` of the run.
    pub(crate) scale: f64,
    /// Logical CPUs of the machine.
    pub(crate) cpus: usize,
    /// `/proc/loadavg` (1, 5, 15 minutes) when the backend's run started and ended: other
    /// work on the machine skews every figure.
    pub(crate) load: [Option<[f64; 3]>; 2],
    /// Whether PostgreSQL's targets apply (PostgreSQL only; MariaDB/MySQL sets its own on a
    /// few rows with [`Report::set_target`]).
    #[serde(skip)]
    pub(crate) targets: bool,
    /// The figures.
    pub(crate) rows: Vec<Row>,
}

impl Report {
    /// Adds a figure (or the error that prevented it).
    pub(crate) fn push(
        &mut self,
        id: &'static str,
        name: impl Into<String>,
        value: anyhow::Result<f64>,
        unit: &'static str,
        target: Option<Target>,
    ) {
        let target = if self.targets { target } else { None };
        let (value, note) = match value {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        };
        let name = name.into();
        match (&value, &note) {
            (Some(v), _) => eprintln!("  {id} {name}: {}", fmt_value(*v, unit)),
            (None, Some(e)) => eprintln!("  {id} {name}: FAILED: {e}"),
            _ => {}
        }
        self.rows.push(Row {
            id,
            name,
            pass: match (target, value) {
                (Some(t), Some(v)) => Some(t.met(v)),
                _ => None,
            },
            value,
            unit,
            target,
            cpu: None,
            note,
            runs: None,
        });
    }

    /// Sets the target of row `row` and whether its figure meets it: a backend's own target
    /// where it is not PostgreSQL's (MariaDB/MySQL), whatever [`Report::targets`] says.
    pub(crate) fn set_target(&mut self, row: usize, target: Option<Target>) {
        if let Some(r) = self.rows.get_mut(row) {
            r.target = target;
            r.pass = match (target, r.value) {
                (Some(t), Some(v)) => Some(t.met(v)),
                _ => None,
            };
        }
    }

    /// Adds a rate with the CPU time behind it.
    pub(crate) fn push_sample(
        &mut self,
        id: &'static str,
        name: impl Into<String>,
        sample: anyhow::Result<Sample>,
        unit: &'static str,
        target: Option<Target>,
    ) {
        let cpu = sample.as_ref().ok().map(|s| s.cpu);
        self.push(id, name, sample.map(|s| s.rate), unit, target);
        if let Some(row) = self.rows.last_mut() {
            row.cpu = cpu;
        }
    }

    /// Adds the median of `runs` with the CPU figures behind it, every run's figure, and a row
    /// of its own (with `spread_row`) for the largest deviation of a run from the median (in %,
    /// target `<= MAX_SPREAD_PCT`), so that an unsteady figure shows as such.
    pub(crate) fn push_runs(
        &mut self,
        id: &'static str,
        name: impl Into<String>,
        runs: Vec<anyhow::Result<Sample>>,
        unit: &'static str,
        target: Option<Target>,
        spread_row: bool,
    ) -> anyhow::Result<Sample> {
        let name = name.into();
        let rates: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|s| s.rate)
            .collect();
        let median = crate::median_sample(runs);
        let spread = median
            .as_ref()
            .map(|m| max_deviation_pct(&rates, m.rate))
            .map_err(|e| anyhow::anyhow!("{e:#}"));
        let kept = median
            .as_ref()
            .map(|m| *m)
            .map_err(|e| anyhow::anyhow!("{e:#}"));
        self.push_sample(id, name.clone(), median, unit, target);
        if let Some(row) = self.rows.last_mut() {
            if row.value.is_some() && rates.len() > 1 {
                eprintln!(
                    "  {id} {name}: runs {}",
                    rates
                        .iter()
                        .map(|v| fmt_value(*v, unit))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                row.runs = Some(rates);
            }
        }
        if spread_row {
            self.push(
                id,
                format!("{name}: largest deviation of a run from the median"),
                spread,
                "%",
                Target::at_most(MAX_SPREAD_PCT),
            );
        }
        kept
    }

    /// The table, as printed.
    pub(crate) fn table(&self) -> String {
        let mut lines = vec![[
            "".to_string(),
            "workload".to_string(),
            "figure".to_string(),
            "target".to_string(),
            "result".to_string(),
            "CPU/unit: bench + server".to_string(),
        ]];
        for r in &self.rows {
            let figure = r
                .value
                .map(|v| fmt_value(v, r.unit))
                .unwrap_or_else(|| "error".into());
            let target = match r.target {
                Some(t) => format!(
                    "{} {}",
                    match t.op {
                        Op::AtLeast => ">=",
                        Op::AtMost => "<=",
                    },
                    fmt_value(t.value, r.unit)
                ),
                None if !self.targets => "n/a".into(),
                None => "-".into(),
            };
            let result = match r.pass {
                Some(true) => "PASS",
                Some(false) => "MISS",
                None if r.value.is_none() => "ERROR",
                None => "-",
            };
            let cpu = r.cpu.map_or(String::new(), |c| match c.server_us {
                Some(s) => format!("{:.0} + {s:.0} us", c.client_us),
                None => format!("{:.0} us", c.client_us),
            });
            lines.push([
                r.id.to_string(),
                r.name.clone(),
                figure,
                target,
                result.to_string(),
                cpu,
            ]);
        }
        let widths: Vec<usize> = (0..6)
            .map(|i| {
                lines
                    .iter()
                    .map(|l| l[i].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let load = |l: Option<[f64; 3]>| {
            l.map_or("?".to_string(), |[a, b, c]| format!("{a:.2} {b:.2} {c:.2}"))
        };
        let mut out = format!(
            "{} ({}), scale {}, {} CPUs, load average {} at start, {} at end\n",
            self.backend,
            self.server,
            self.scale,
            self.cpus,
            load(self.load[0]),
            load(self.load[1])
        );
        if cfg!(debug_assertions) || self.scale != 1.0 {
            out.push_str(
                "not comparable with the targets: they hold for a release build at scale 1 \
                 (the README's command); this run shows the bench runs\n",
            );
        }
        for (n, l) in lines.iter().enumerate() {
            let cells: Vec<String> = l
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| {
                    if i == 2 || i == 3 || i == 5 {
                        format!("{c:>w$}")
                    } else {
                        format!("{c:<w$}")
                    }
                })
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
            if n == 0 {
                let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
                out.push_str(&rule.join("  "));
                out.push('\n');
            }
        }
        for r in &self.rows {
            if let Some(runs) = &r.runs {
                let all: Vec<String> = runs.iter().map(|v| fmt_value(*v, r.unit)).collect();
                out.push_str(&format!("runs: {} {}: {}\n", r.id, r.name, all.join(", ")));
            }
        }
        for r in self.rows.iter().filter(|r| r.note.is_some()) {
            out.push_str(&format!(
                "note: {} {}: {}\n",
                r.id,
                r.name,
                r.note.as_deref().unwrap_or("")
            ));
        }
        out
    }
}

/// How far every run of a median may be from it, in % (the bound for a steady figure).
pub(crate) const MAX_SPREAD_PCT: f64 = 20.0;

/// The largest |run - median| / median of the runs, in %.
pub(crate) fn max_deviation_pct(runs: &[f64], median: f64) -> f64 {
    if median == 0.0 {
        return 0.0;
    }
    runs.iter()
        .map(|v| ((v - median) / median).abs() * 100.0)
        .fold(0.0, f64::max)
}

/// A figure with its unit: thousands separators for rates, two decimals for the rest.
pub(crate) fn fmt_value(v: f64, unit: &str) -> String {
    match unit {
        "msgs/s" | "tx/s" => format!("{} {unit}", thousands(v.round() as i64)),
        "x" => format!("{v:.2} x"),
        "ms" => format!("{v:.2} ms"),
        "%" => format!("{v:.1} %"),
        _ => format!("{v:.1} {unit}"),
    }
}

fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// The 1, 5 and 15-minute load averages of the machine, where `/proc/loadavg` exists.
pub(crate) fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}
