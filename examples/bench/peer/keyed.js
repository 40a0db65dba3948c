// W9's peer: graphile-worker 0.17 draining N jobs spread over K queues (`queue_name`), so that
// the jobs of one queue run one at a time, in order, as the messages of one ordering key do.
// Run from the bench with NODE_PATH naming the prepared peer folder's node_modules:
//   node keyed.js N CONCURRENCY KEYS
// Prints `RESULT <tab> graphile-worker(node) <tab> W9 keyed drain <tab> <config> <tab> <jobs/s>`,
// and fails when a queue's jobs ran out of order.
const { run, runMigrations, Logger } = require("graphile-worker");
const { Pool } = require("pg");

const url = process.env.DATABASE_URL;
const schema = "graphile_worker";
const [n, concurrency, keys] = process.argv.slice(2).map(Number);
// The batching preset the W1 comparison uses.
const preset = { worker: { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } };
const lastSeq = new Map();
let handled = 0;
let outOfOrder = 0;
const taskList = {
  bench: async (p) => {
    const key = p.seq % keys;
    if ((lastSeq.get(key) ?? -1) > p.seq) outOfOrder++;
    lastSeq.set(key, p.seq);
    handled++;
  },
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const pool = new Pool({ connectionString: url, max: 4 });
  const options = { connectionString: url, schema, noHandleSignals: true, taskList, logger: new Logger(() => () => {}), preset };
  await runMigrations(options);
  await pool.query(`DELETE FROM ${schema}._private_jobs`);
  await pool.query(`VACUUM ANALYZE ${schema}._private_jobs`);
  await pool.query(
    `SELECT ${schema}.add_job('bench', json_build_object('seq', g, 'note', repeat('x', 160)), queue_name := 'k' || (g % $1))
     FROM generate_series(0, $2 - 1) g`,
    [keys, n],
  );
  await pool.query(`ANALYZE ${schema}._private_jobs`);
  const t0 = Number(process.hrtime.bigint()) / 1e6;
  const runner = await run({ ...options, concurrency });
  while (handled < n) await sleep(5);
  for (;;) {
    const r = await pool.query(`SELECT count(*)::int AS c FROM ${schema}._private_jobs`);
    if (r.rows[0].c === 0) break;
    await sleep(10);
  }
  const secs = (Number(process.hrtime.bigint()) / 1e6 - t0) / 1000;
  await runner.stop();
  await pool.end();
  if (outOfOrder > 0) throw new Error(`${outOfOrder} jobs ran before an earlier job of their queue`);
  console.log(["RESULT", "graphile-worker(node)", "W9 keyed drain", `concurrency=${concurrency},keys=${keys}`, (n / secs).toFixed(1), "jobs/s"].join("\t"));
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
