#!/usr/bin/env node
// greenserve-node: a small command line for the greenserve gRPC services, built on ../src/index.js.
// Run with --help for usage. Output is JSON on stdout (one line per message); errors go to stderr as
// "<STATUS_CODE_NAME>: <message>" plus one line per greenserve.v1.ErrorDetail.
//
// Exit status: 0 success; 1 the call failed (or health is not SERVING); 2 bad usage.

import process from 'node:process';

import { checkHealth, createClient, describeService, enrichError } from '../src/index.js';

const USAGE = `usage: greenserve-node --addr HOST:PORT [options] COMMAND [ARGS]

options (before or after the command):
  --addr HOST:PORT        service address (env GREENSERVE_ADDR)
  --token T               bearer token sent as "authorization: Bearer T" (env GREENSERVE_TOKEN)
  --ca FILE               PEM CA bundle; turns TLS on
  --cert FILE --key FILE  client certificate and key (mTLS); turns TLS on
  --tls                   TLS with the system roots
  --server-name NAME      TLS server name to expect (overrides the host of --addr)
  --deadline-ms MS        deadline of each call (default 10000)
  -h, --help              this help

commands:
  health [SERVICE]        grpc.health.v1.Health/Check; prints {"status":"SERVING"}; exits 1 unless SERVING
  estimate-carbon --energy-kwh X --ci-g-per-kwh Y --duration-s Z
                  [--mean-batch-size B] [--cache-allocated-bytes N]
                          greenserve.v1.OptimizerService/EstimateCarbon; prints the response
  call SERVICE METHOD [JSON]
                          any unary or server-streaming method, e.g.
                          call OptimizerService GetPlan '{"version":"0"}'
`;

// Options that take a value; everything else starting with "--" is a boolean flag. A value is always
// the next argument, even when it starts with "-" (so "--energy-kwh -1" passes -1 through).
const VALUE_OPTIONS = new Set([
  'addr',
  'token',
  'ca',
  'cert',
  'key',
  'server-name',
  'deadline-ms',
  'energy-kwh',
  'ci-g-per-kwh',
  'duration-s',
  'mean-batch-size',
  'cache-allocated-bytes',
]);
const FLAG_OPTIONS = new Set(['tls', 'help']);

class UsageError extends Error {}

function parseArgs(argv) {
  const options = {};
  const positionals = [];
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i];
    if (arg === '-h') {
      options.help = true;
    } else if (arg === '--') {
      positionals.push(...argv.slice(i + 1));
      break;
    } else if (arg.startsWith('--')) {
      const eq = arg.indexOf('=');
      const name = eq === -1 ? arg.slice(2) : arg.slice(2, eq);
      if (VALUE_OPTIONS.has(name)) {
        if (eq !== -1) {
          options[name] = arg.slice(eq + 1);
        } else {
          if (i + 1 >= argv.length) throw new UsageError(`--${name} needs a value`);
          options[name] = argv[i + 1];
          i += 1;
        }
      } else if (FLAG_OPTIONS.has(name) && eq === -1) {
        options[name] = true;
      } else {
        throw new UsageError(`unknown option --${name}`);
      }
    } else {
      positionals.push(arg);
    }
  }
  return { options, positionals };
}

function number(options, name, { required = false } = {}) {
  const raw = options[name];
  if (raw === undefined) {
    if (required) throw new UsageError(`--${name} is required`);
    return undefined;
  }
  const value = Number(raw);
  if (raw.trim() === '' || !Number.isFinite(value)) {
    throw new UsageError(`--${name} must be a number, got "${raw}"`);
  }
  return value;
}

function clientOptions(options) {
  const token = options.token ?? process.env.GREENSERVE_TOKEN ?? undefined;
  const tlsWanted = options.tls || options.ca || options.cert || options.key || options['server-name'];
  const opts = { token: token || undefined };
  if (tlsWanted) {
    opts.tls = {
      ca: options.ca,
      cert: options.cert,
      key: options.key,
      serverName: options['server-name'],
    };
  }
  const deadlineMs = number(options, 'deadline-ms');
  if (deadlineMs !== undefined) {
    if (deadlineMs <= 0) throw new UsageError('--deadline-ms must be > 0');
    opts.deadlineMs = deadlineMs;
  }
  return opts;
}

function printJson(value) {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

async function cmdHealth(address, args, opts) {
  if (args.length > 1) throw new UsageError('health takes at most one SERVICE');
  const status = await checkHealth(address, args[0] ?? '', opts);
  printJson({ status });
  return status === 'SERVING' ? 0 : 1;
}

async function cmdEstimateCarbon(address, args, options, opts) {
  if (args.length) throw new UsageError(`estimate-carbon takes no positional arguments: ${args.join(' ')}`);
  const request = {
    energy_kwh: number(options, 'energy-kwh', { required: true }),
    ci_g_per_kwh: number(options, 'ci-g-per-kwh', { required: true }),
    duration_s: number(options, 'duration-s', { required: true }),
  };
  const batch = number(options, 'mean-batch-size');
  if (batch !== undefined) request.mean_batch_size = batch;
  const bytes = options['cache-allocated-bytes'];
  if (bytes !== undefined) {
    if (!/^\d+$/.test(bytes)) throw new UsageError('--cache-allocated-bytes must be a non-negative integer');
    request.cache_allocated_bytes = bytes; // uint64 as a decimal string
  }
  const client = createClient('OptimizerService', address, opts);
  try {
    printJson(await client.EstimateCarbon(request));
  } finally {
    client.close();
  }
  return 0;
}

async function cmdCall(address, args, opts) {
  if (args.length < 2 || args.length > 3) throw new UsageError('call needs SERVICE METHOD [JSON]');
  const [service, method, json] = args;
  let methods;
  try {
    methods = describeService(service);
  } catch (err) {
    throw new UsageError(err.message);
  }
  const info = methods[method];
  if (!info) throw new UsageError(`${service} has no method ${method}; it has ${Object.keys(methods).join(', ')}`);
  let request = {};
  if (json !== undefined) {
    try {
      request = JSON.parse(json);
    } catch (err) {
      throw new UsageError(`request is not valid JSON: ${err.message}`);
    }
  }
  const client = createClient(service, address, opts);
  try {
    if (info.kind === 'unary') {
      printJson(await client[method](request));
    } else if (info.kind === 'server_streaming') {
      for await (const message of client[method](request)) printJson(message);
    } else {
      throw new UsageError(`${method} is ${info.kind}; the CLI calls unary and server-streaming methods only`);
    }
  } finally {
    client.close();
  }
  return 0;
}

async function main(argv) {
  const { options, positionals } = parseArgs(argv);
  if (options.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  const [command, ...args] = positionals;
  if (!command) throw new UsageError('no command given');
  const address = options.addr ?? process.env.GREENSERVE_ADDR;
  if (!address) throw new UsageError('--addr HOST:PORT is required');
  const opts = clientOptions(options);
  switch (command) {
    case 'health':
      return cmdHealth(address, args, opts);
    case 'estimate-carbon':
      return cmdEstimateCarbon(address, args, options, opts);
    case 'call':
      return cmdCall(address, args, opts);
    default:
      throw new UsageError(`unknown command "${command}"`);
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err) => {
    if (err instanceof UsageError) {
      process.stderr.write(`greenserve-node: ${err.message}\n\n${USAGE}`);
      process.exitCode = 2;
    } else if (typeof err?.code === 'number') {
      enrichError(err);
      process.stderr.write(`${err.codeName}: ${err.details || err.message || '(no message)'}\n`);
      for (const d of err.errorDetails ?? []) {
        if (d.type_url) continue;
        process.stderr.write(
          `  detail: reason=${d.reason} field=${d.field || '-'} service=${d.service || '-'} message=${d.message}\n`,
        );
      }
      process.exitCode = 1;
    } else {
      process.stderr.write(`greenserve-node: ${err?.message ?? err}\n`);
      process.exitCode = 1;
    }
  },
);
