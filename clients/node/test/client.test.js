// Unit tests of the Node client that need no greenserve service: the contract loads from the repo's
// protos, and the client's own behaviour (bearer token metadata, deadlines, error decoding, streams,
// TLS, health, CLI) is checked against small grpc-js servers started here. Those servers are test
// doubles of the *transport*, not of greenserve: tests/contract/test_node_client.py runs the same
// client against the real Python optimizer.

import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import {
  AUTHORIZATION_KEY,
  PROTOS_DIR,
  SERVICE_NAMES,
  checkHealth,
  createClient,
  describeService,
  errorStatusTypes,
  formatError,
  greenserveProtoFiles,
  grpc,
  loadGreenserve,
  loadHealth,
} from '../src/index.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const CLI = path.resolve(HERE, '..', 'bin', 'greenserve-node.js');

// Every rpc of the contract, by service, with its streaming kind. New methods may be added to the
// protos without breaking this test; removing or re-shaping one of these breaks clients.
const EXPECTED_METHODS = {
  ForecasterService: {
    IngestPoints: 'unary',
    StreamLoad: 'client_streaming',
    GetPoints: 'unary',
    ListSeries: 'unary',
    GetCurrentCarbonIntensity: 'unary',
    GetForecast: 'unary',
    Backtest: 'unary',
  },
  ProfilerService: {
    StartSweep: 'unary',
    GetSweep: 'unary',
    WatchSweep: 'server_streaming',
    CancelSweep: 'unary',
    ListSweeps: 'unary',
    GetProfile: 'unary',
    ListProfiles: 'unary',
    PutProfile: 'unary',
  },
  OptimizerService: {
    ComputePlan: 'unary',
    GetPlan: 'unary',
    ListPlans: 'unary',
    ActivatePlan: 'unary',
    WatchPlans: 'server_streaming',
    SetFleet: 'unary',
    GetFleet: 'unary',
    EstimateCarbon: 'unary',
  },
  CacheManagerService: {
    RegisterCacheServer: 'unary',
    DeregisterCacheServer: 'unary',
    ListCacheServers: 'unary',
    ApplyCachePlan: 'unary',
    ResizeCache: 'unary',
    SetQuota: 'unary',
    ReportAccesses: 'client_streaming',
    ListEvictionCandidates: 'unary',
    ComputeGroupTtls: 'unary',
    DecideReadOrRecompute: 'unary',
  },
  GpuPartitionerService: {
    GetInventory: 'unary',
    ListLayouts: 'unary',
    DiffLayouts: 'unary',
    ApplyLayout: 'unary',
    GetApply: 'unary',
    GetEnergy: 'unary',
    ConvertMigPartedConfig: 'unary',
  },
  RouterService: {
    Generate: 'server_streaming',
    Route: 'unary',
    RegisterEngine: 'unary',
    DeregisterEngine: 'unary',
    ListEngines: 'unary',
    Drain: 'unary',
    Undrain: 'unary',
  },
};

const HEALTHY_SERVICE = 'greenserve.v1.OptimizerService';

function unimplemented(call, callback) {
  callback({ code: grpc.status.UNIMPLEMENTED, details: 'not in this test server' });
}

function authorizationOf(call) {
  return call.metadata.get(AUTHORIZATION_KEY).map(String).join(',');
}

// A fake OptimizerService: EstimateCarbon echoes what it received (authorization header and custom
// metadata in carbon_params.components[].name) so the client's metadata handling is observable.
function optimizerImpl() {
  const { Status, ErrorDetail, errorDetailTypeUrl } = errorStatusTypes();
  const impl = Object.fromEntries(
    Object.keys(loadGreenserve().OptimizerService.service).map((name) => [name, unimplemented]),
  );
  impl.EstimateCarbon = (call, callback) => {
    const req = call.request;
    if (req.energy_kwh < 0) {
      const detail = ErrorDetail.encode(
        ErrorDetail.fromObject({
          reason: 'ERROR_REASON_INVALID_FIELD',
          field: 'energy_kwh',
          message: 'must be >= 0',
          service: 'optimizer',
        }),
      ).finish();
      const status = Status.encode(
        Status.fromObject({
          code: grpc.status.INVALID_ARGUMENT,
          message: 'energy_kwh must be >= 0',
          details: [{ type_url: errorDetailTypeUrl, value: detail }],
        }),
      ).finish();
      const trailers = new grpc.Metadata();
      trailers.set('grpc-status-details-bin', Buffer.from(status));
      callback({ code: grpc.status.INVALID_ARGUMENT, details: 'energy_kwh must be >= 0', metadata: trailers });
      return;
    }
    const delayMs = req.duration_s === 999 ? 600 : 0; // lets the deadline test time out
    setTimeout(() => {
      const operational = req.energy_kwh * req.ci_g_per_kwh;
      callback(null, {
        carbon: {
          operational_g: operational,
          embodied_compute_g: 1.5,
          total_g: operational + 1.5,
          energy_kwh: req.energy_kwh,
          ci_g_per_kwh: req.ci_g_per_kwh,
        },
        carbon_params: {
          pue: 1,
          components: [
            { kind: 'COMPONENT_KIND_GPU', name: `auth=${authorizationOf(call)}` },
            { kind: 'COMPONENT_KIND_CPU', name: `x-trace=${call.metadata.get('x-trace').join(',')}` },
          ],
        },
      });
    }, delayMs);
  };
  impl.GetFleet = (call, callback) => {
    callback(null, {
      fleet: { max_cache_storage_bytes: '18446744073709551615' },
      updated_at: { seconds: '1700000000', nanos: 5 },
    });
  };
  impl.WatchPlans = (call) => {
    const first = Number(call.request.after_version) + 1;
    call.write({ plan: { version: String(first), state: 'PLAN_STATE_ACTIVE', trigger: authorizationOf(call) } });
    call.write({ plan: { version: String(first + 1), state: 'PLAN_STATE_ACTIVE' } });
    call.end();
  };
  return impl;
}

function forecasterImpl() {
  const impl = Object.fromEntries(
    Object.keys(loadGreenserve().ForecasterService.service).map((name) => [name, unimplemented]),
  );
  impl.StreamLoad = (call, callback) => {
    let accepted = 0;
    call.on('data', (sample) => {
      assert.equal(typeof sample.input_tokens, 'string');
      accepted += 1;
    });
    call.on('end', () => callback(null, { accepted_samples: accepted }));
  };
  return impl;
}

function healthImpl() {
  return {
    Check(call, callback) {
      const { service } = call.request;
      if (service === '' || service === HEALTHY_SERVICE) {
        callback(null, { status: 'SERVING' });
      } else if (service === 'greenserve.v1.RouterService') {
        callback(null, { status: 'NOT_SERVING' });
      } else {
        callback({ code: grpc.status.NOT_FOUND, details: '' }); // as grpcio's health servicer does
      }
    },
    Watch(call) {
      call.write({ status: 'SERVING' });
      call.end();
    },
  };
}

async function startServer(credentials = grpc.ServerCredentials.createInsecure()) {
  const v1 = loadGreenserve();
  const server = new grpc.Server();
  server.addService(v1.OptimizerService.service, optimizerImpl());
  server.addService(v1.ForecasterService.service, forecasterImpl());
  server.addService(loadHealth().Health.service, healthImpl());
  const port = await new Promise((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', credentials, (err, p) => (err ? reject(err) : resolve(p))),
  );
  return { server, address: `127.0.0.1:${port}` };
}

function stopServer(server) {
  return new Promise((resolve) => server.tryShutdown(() => resolve()));
}

function runCli(args, env = {}) {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [CLI, ...args],
      { env: { ...process.env, GREENSERVE_TOKEN: '', ...env }, timeout: 20_000 },
      (err, stdout, stderr) => resolve({ code: err ? err.code : 0, stdout, stderr }),
    );
  });
}

describe('contract loading', () => {
  test('finds the protos of the repository, not a copy', () => {
    assert.equal(path.basename(PROTOS_DIR), 'protos');
    const files = greenserveProtoFiles();
    assert.ok(files.includes('greenserve/v1/common.proto'));
    assert.ok(files.includes('greenserve/v1/optimizer.proto'));
    assert.equal(files.length, 7);
  });

  test('all six services load with their methods and streaming kinds', () => {
    assert.deepEqual([...SERVICE_NAMES].sort(), Object.keys(EXPECTED_METHODS).sort());
    const v1 = loadGreenserve();
    for (const [service, methods] of Object.entries(EXPECTED_METHODS)) {
      assert.equal(typeof v1[service], 'function', `${service} is a client constructor`);
      const described = describeService(service);
      for (const [method, kind] of Object.entries(methods)) {
        assert.ok(described[method], `${service}.${method} exists`);
        assert.equal(described[method].kind, kind, `${service}.${method} is ${kind}`);
        assert.equal(described[method].path, `/greenserve.v1.${service}/${method}`);
      }
    }
    assert.equal(describeService('greenserve.v1.RouterService').Generate.responseStream, true);
    assert.equal(describeService('RouterService').Generate.requestStream, false);
  });

  test('messages with google.protobuf.Timestamp fields load', () => {
    const v1 = loadGreenserve();
    const fields = v1.Plan.type.field.map((f) => [f.name, f.typeName]);
    assert.deepEqual(
      fields.find(([name]) => name === 'created_at'),
      ['created_at', 'google.protobuf.Timestamp'],
    );
  });

  test('every service gets a client with one wrapper per method', () => {
    for (const [service, methods] of Object.entries(EXPECTED_METHODS)) {
      const client = createClient(service, '127.0.0.1:1');
      try {
        for (const method of Object.keys(methods)) {
          assert.equal(typeof client[method], 'function', `${service}.${method}`);
          const camel = method[0].toLowerCase() + method.slice(1);
          assert.equal(client[camel], client[method], `${service}.${camel} alias`);
        }
        assert.equal(client.service, `greenserve.v1.${service}`);
      } finally {
        client.close();
      }
    }
  });

  test('unknown services and bad options are refused', () => {
    assert.throws(() => createClient('NoSuchService', '127.0.0.1:1'), /unknown greenserve service/);
    assert.throws(() => createClient('OptimizerService', ''), /address/);
    assert.throws(() => createClient('OptimizerService', '127.0.0.1:1', { token: 'a\nb' }), /printable/);
    assert.throws(
      () => createClient('OptimizerService', '127.0.0.1:1', { tls: { cert: Buffer.from('x') } }),
      /together/,
    );
  });
});

describe('calls against a local grpc-js server', () => {
  let server;
  let address;

  before(async () => {
    ({ server, address } = await startServer());
  });
  after(async () => {
    await stopServer(server);
  });

  test('the token interceptor adds "authorization: Bearer <token>" on an insecure channel', async () => {
    const client = createClient('OptimizerService', address, { token: 's3cret' });
    try {
      const res = await client.EstimateCarbon({ energy_kwh: 2, ci_g_per_kwh: 50, duration_s: 60 });
      assert.equal(res.carbon_params.components[0].name, 'auth=Bearer s3cret');
      assert.equal(res.carbon.operational_g, 100);
      assert.equal(res.carbon_params.components[0].kind, 'COMPONENT_KIND_GPU'); // enums as names
    } finally {
      client.close();
    }
  });

  test('no authorization header without a token; per-call metadata passes through', async () => {
    const plain = createClient('OptimizerService', address);
    const withToken = createClient('OptimizerService', address, { token: 't' });
    try {
      const res = await plain.estimateCarbon({ energy_kwh: 1, ci_g_per_kwh: 1, duration_s: 1 });
      assert.equal(res.carbon_params.components[0].name, 'auth=');
      const res2 = await withToken.EstimateCarbon(
        { energy_kwh: 1, ci_g_per_kwh: 1, duration_s: 1 },
        { metadata: { 'x-trace': 'abc' } },
      );
      assert.equal(res2.carbon_params.components[0].name, 'auth=Bearer t');
      assert.equal(res2.carbon_params.components[1].name, 'x-trace=abc');
    } finally {
      plain.close();
      withToken.close();
    }
  });

  test('64-bit integers come back as strings and Timestamps as {seconds, nanos}', async () => {
    const client = createClient('OptimizerService', address);
    try {
      const res = await client.GetFleet({});
      assert.equal(res.fleet.max_cache_storage_bytes, '18446744073709551615');
      assert.deepEqual(res.updated_at, { seconds: '1700000000', nanos: 5 });
      assert.deepEqual(res.fleet.pools, []); // defaults: true
    } finally {
      client.close();
    }
  });

  test('unary calls get the default deadline and can override it per call', async () => {
    const client = createClient('OptimizerService', address, { deadlineMs: 200 });
    try {
      const started = Date.now();
      await assert.rejects(
        client.EstimateCarbon({ energy_kwh: 1, ci_g_per_kwh: 1, duration_s: 999 }),
        (err) => err.codeName === 'DEADLINE_EXCEEDED',
      );
      assert.ok(Date.now() - started < 550, 'default deadline applied');
      const res = await client.EstimateCarbon(
        { energy_kwh: 1, ci_g_per_kwh: 1, duration_s: 999 },
        { deadlineMs: 5000 },
      );
      assert.equal(res.carbon.operational_g, 1);
    } finally {
      client.close();
    }
  });

  test('errors carry the status code name and the decoded ErrorDetail', async () => {
    const client = createClient('OptimizerService', address);
    try {
      await assert.rejects(
        client.EstimateCarbon({ energy_kwh: -1, ci_g_per_kwh: 1, duration_s: 1 }),
        (err) => {
          assert.equal(err.code, grpc.status.INVALID_ARGUMENT);
          assert.equal(err.codeName, 'INVALID_ARGUMENT');
          assert.deepEqual(err.errorDetails, [
            {
              reason: 'ERROR_REASON_INVALID_FIELD',
              field: 'energy_kwh',
              message: 'must be >= 0',
              service: 'optimizer',
            },
          ]);
          assert.equal(formatError(err), 'INVALID_ARGUMENT: energy_kwh must be >= 0 [field energy_kwh]');
          return true;
        },
      );
      await assert.rejects(client.ComputePlan({}), (err) => err.codeName === 'UNIMPLEMENTED' && err.errorDetails.length === 0);
    } finally {
      client.close();
    }
  });

  test('server-streaming methods are async-iterable and carry the token', async () => {
    const client = createClient('OptimizerService', address, { token: 'w' });
    try {
      const versions = [];
      for await (const event of client.WatchPlans({ after_version: '4' })) {
        versions.push(event.plan.version);
        if (versions.length === 1) assert.equal(event.plan.trigger, 'Bearer w');
      }
      assert.deepEqual(versions, ['5', '6']);
    } finally {
      client.close();
    }
  });

  test('client-streaming methods return a writable call with a response promise', async () => {
    const client = createClient('ForecasterService', address);
    try {
      const call = client.StreamLoad();
      for (let i = 0; i < 3; i += 1) {
        call.write({ pool: 'p', time: { seconds: String(1700000000 + i), nanos: 0 }, requests: i, input_tokens: '10' });
      }
      call.end();
      const res = await call.response;
      assert.equal(res.accepted_samples, 3);
    } finally {
      client.close();
    }
  });

  test('checkHealth reports the standard grpc.health.v1 status', async () => {
    assert.equal(await checkHealth(address, HEALTHY_SERVICE), 'SERVING');
    assert.equal(await checkHealth(address), 'SERVING');
    assert.equal(await checkHealth(address, 'greenserve.v1.RouterService'), 'NOT_SERVING');
    await assert.rejects(
      checkHealth(address, 'nope'),
      (err) => err.codeName === 'NOT_FOUND' && /does not know service "nope"/.test(err.details),
    );
  });

  test('unreachable servers fail with UNAVAILABLE', async () => {
    await assert.rejects(
      checkHealth('127.0.0.1:1', '', { deadlineMs: 3000 }),
      (err) => ['UNAVAILABLE', 'DEADLINE_EXCEEDED'].includes(err.codeName),
    );
  });

  describe('CLI', () => {
    test('health prints {"status":"SERVING"}', async () => {
      const r = await runCli(['--addr', address, 'health', HEALTHY_SERVICE]);
      assert.equal(r.code, 0, r.stderr);
      assert.deepEqual(JSON.parse(r.stdout), { status: 'SERVING' });
      const bad = await runCli(['health', 'greenserve.v1.RouterService', '--addr', address]);
      assert.equal(bad.code, 1);
      assert.deepEqual(JSON.parse(bad.stdout), { status: 'NOT_SERVING' });
    });

    test('estimate-carbon prints the response as JSON on one line, token from the env', async () => {
      const r = await runCli(
        ['--addr', address, 'estimate-carbon', '--energy-kwh', '1', '--ci-g-per-kwh', '100', '--duration-s', '3600'],
        { GREENSERVE_TOKEN: 'envtok' },
      );
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.stdout.trim().split('\n').length, 1);
      const res = JSON.parse(r.stdout);
      assert.equal(res.carbon.operational_g, 100);
      assert.equal(res.carbon_params.components[0].name, 'auth=Bearer envtok');
    });

    test('errors exit 1 with the status code name, message and field on stderr', async () => {
      const r = await runCli([
        '--addr', address, '--token', 'x',
        'estimate-carbon', '--energy-kwh', '-1', '--ci-g-per-kwh', '100', '--duration-s', '3600',
      ]);
      assert.equal(r.code, 1);
      assert.equal(r.stdout, '');
      assert.match(r.stderr, /^INVALID_ARGUMENT: energy_kwh must be >= 0/);
      assert.match(r.stderr, /field=energy_kwh/);
    });

    test('usage errors exit 2', async () => {
      const missing = await runCli(['--addr', address, 'estimate-carbon', '--energy-kwh', '1']);
      assert.equal(missing.code, 2);
      assert.match(missing.stderr, /--ci-g-per-kwh is required/);
      const nan = await runCli(['--addr', address, 'estimate-carbon', '--energy-kwh', 'x', '--ci-g-per-kwh', '1', '--duration-s', '1']);
      assert.equal(nan.code, 2);
      const noAddr = await runCli(['health'], { GREENSERVE_ADDR: '' });
      assert.equal(noAddr.code, 2);
      const help = await runCli(['--help']);
      assert.equal(help.code, 0);
      assert.match(help.stdout, /estimate-carbon/);
    });

    test('call runs any unary or server-streaming method with a JSON request', async () => {
      const r = await runCli(['--addr', address, 'call', 'OptimizerService', 'WatchPlans', '{"after_version":"0"}']);
      assert.equal(r.code, 0, r.stderr);
      assert.deepEqual(r.stdout.trim().split('\n').map((l) => JSON.parse(l).plan.version), ['1', '2']);
      const u = await runCli(['--addr', address, 'call', 'greenserve.v1.OptimizerService', 'GetFleet']);
      assert.equal(u.code, 0, u.stderr);
      assert.equal(JSON.parse(u.stdout).fleet.max_cache_storage_bytes, '18446744073709551615');
    });
  });
});

function haveOpenssl() {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

describe('TLS', { skip: haveOpenssl() ? false : 'openssl is not installed' }, () => {
  let dir;
  let server;
  let address;
  let ca;

  before(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'greenserve-node-tls-'));
    const key = path.join(dir, 'key.pem');
    const cert = path.join(dir, 'cert.pem');
    execFileSync(
      'openssl',
      [
        'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1',
        '-keyout', key, '-out', cert, '-subj', '/CN=localhost',
        '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1',
      ],
      { stdio: 'ignore' },
    );
    ca = readFileSync(cert);
    ({ server, address } = await startServer(
      grpc.ServerCredentials.createSsl(null, [{ private_key: readFileSync(key), cert_chain: ca }], false),
    ));
  });
  after(async () => {
    if (server) await stopServer(server);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('the token rides on call credentials composed with the TLS channel credentials', async () => {
    const client = createClient('OptimizerService', address, {
      token: 'tls-token',
      tls: { ca, serverName: 'localhost' },
    });
    try {
      const res = await client.EstimateCarbon({ energy_kwh: 1, ci_g_per_kwh: 3, duration_s: 1 });
      assert.equal(res.carbon_params.components[0].name, 'auth=Bearer tls-token');
    } finally {
      client.close();
    }
  });

  test('CLI --ca turns TLS on; without the CA the server is not trusted', async () => {
    const caFile = path.join(dir, 'cert.pem');
    const r = await runCli(['--addr', address, '--ca', caFile, '--server-name', 'localhost', 'health', HEALTHY_SERVICE]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), { status: 'SERVING' });
    await assert.rejects(
      checkHealth(address, '', { tls: { serverName: 'localhost' }, deadlineMs: 3000 }),
      (err) => ['UNAVAILABLE', 'DEADLINE_EXCEEDED'].includes(err.codeName),
    );
  });
});
