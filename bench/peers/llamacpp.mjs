// llama.cpp as a peer, through node-llama-cpp's prebuilt CPU binaries (no compiler needed):
// one process per measurement, one JSON object on stdout.
// argv[2]: {"model": path, "prompt": [ids], "decode": n, "threads": t, "ctx": n, "top": k}
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const job = JSON.parse(process.argv[2]);
const kb = () => process.resourceUsage().maxRSS;  // peak RSS so far, in KiB
const rssKb = () => process.memoryUsage().rss / 1024;  // resident now
const now = () => Number(process.hrtime.bigint()) / 1e9;

// The library and its CPU backend load first, as `import llama_cpp` does before a Python
// bench starts its clock; load_s is the model's own open, init_s the library's.
const tInit = now();
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error,
                              maxThreads: job.threads});
const initS = now() - tInit;
const baseKb = rssKb();  // after the library's start, whose probing peaks higher
const t0 = now();
const model = await llama.loadModel({modelPath: job.model, gpuLayers: 0});
const context = await model.createContext({contextSize: job.ctx, threads: job.threads,
                                           batchSize: Math.min(512, job.ctx), sequences: 1});
const seq = context.getSequence();
const loaded = now();
const loadKb = rssKb();

const prompt = job.prompt;
await seq.evaluateWithoutGeneratingNewTokens(prompt.slice(0, -1));
const prefilled = now();

const out = [];
const tops = [];
let first = null;
const wantTop = (job.top ?? 0) > 0;
const gen = wantTop
  ? seq.evaluateWithMetadata(prompt.slice(-1), {probabilities: true}, {temperature: 0})
  : seq.evaluate(prompt.slice(-1), {temperature: 0});
for await (const item of gen) {
  if (first === null) first = now();
  const id = wantTop ? item.token : item;
  out.push(id);
  if (wantTop) {
    const probs = [...item.probabilities.entries()].slice(0, job.top);
    tops.push(probs);
  }
  if (out.length >= job.decode) break;
}
const done = now();
console.log(JSON.stringify({
  engine: "llama.cpp (node-llama-cpp " + (process.env.NLC_VERSION || "?") + ")",
  init_s: initS,
  load_s: loaded - t0,
  prefill_tokens: prompt.length - 1,
  prefill_s: prefilled - loaded,
  prefill_tok_s: (prompt.length - 1) / (prefilled - loaded),
  ttft_s: first - loaded,
  decode_tokens: out.length - 1,
  decode_tok_s: (out.length - 1) / (done - first),
  tokens: out,
  top: wantTop ? tops : undefined,
  base_rss_mb: baseKb / 1024,
  load_rss_mb: loadKb / 1024,
  peak_rss_mb: kb() / 1024,
  threads: job.threads,
}));
await context.dispose();
await model.dispose();
await llama.dispose();
