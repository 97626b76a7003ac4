// greenserve Node.js client.
//
// Loads the greenserve.v1 contract at runtime from the repository's `protos/` folder (the same files
// the Python services are generated from; nothing is copied or generated here) with
// @grpc/proto-loader, and wraps the @grpc/grpc-js clients with:
//   - channel credentials: insecure, TLS (`tls: {ca}`) or mTLS (`tls: {ca, cert, key}`);
//   - an `authorization: Bearer <token>` header on every call (call credentials composed with the
//     TLS credentials, or a client interceptor on insecure channels, where grpc-js refuses call
//     credentials);
//   - promise-returning unary methods with a default deadline;
//   - errors carrying `codeName` ("INVALID_ARGUMENT", ...) and the decoded greenserve.v1.ErrorDetail
//     entries of the `grpc-status-details-bin` trailer (`errorDetails`);
//   - the standard grpc.health.v1 health check.
//
// Conversion options follow proto-loader's: field names as in the protos (snake_case), 64-bit integers
// as decimal strings, enums as their names, defaults filled in, oneof virtual fields set.

import { existsSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import protobuf from 'protobufjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));

/** Root of this package (clients/node). */
export const PACKAGE_DIR = path.resolve(HERE, '..');

/** The repository's protos folder; GREENSERVE_PROTOS_DIR overrides it (e.g. in a container). */
export const PROTOS_DIR = process.env.GREENSERVE_PROTOS_DIR
  ? path.resolve(process.env.GREENSERVE_PROTOS_DIR)
  : path.resolve(PACKAGE_DIR, '..', '..', 'protos');

/** Protos this client brings itself: grpc/health/v1/health.proto and google/rpc/status.proto. */
export const CLIENT_PROTO_DIR = path.join(PACKAGE_DIR, 'proto');

/** Protobuf package of the contract. */
export const PROTO_PACKAGE = 'greenserve.v1';

/** The six services of the contract. */
export const SERVICE_NAMES = Object.freeze([
  'ForecasterService',
  'ProfilerService',
  'OptimizerService',
  'CacheManagerService',
  'GpuPartitionerService',
  'RouterService',
]);

/** Options given to proto-loader (and used when decoding error details). */
export const LOADER_OPTIONS = Object.freeze({
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});

/** Deadline applied to unary calls when the caller gives none. */
export const DEFAULT_DEADLINE_MS = 10_000;

/** Metadata key the services' bearer-token interceptor reads. */
export const AUTHORIZATION_KEY = 'authorization';

/** Type URL suffix of greenserve.v1.ErrorDetail inside google.rpc.Status.details. */
const ERROR_DETAIL_TYPE = `${PROTO_PACKAGE}.ErrorDetail`;

// ---------------------------------------------------------------------------------------------------
// Loading the contract

/**
 * Relative names ("greenserve/v1/common.proto", ...) of every .proto file of the contract.
 * @param {string} [protosDir]
 * @returns {string[]}
 */
export function greenserveProtoFiles(protosDir = PROTOS_DIR) {
  const dir = path.join(protosDir, 'greenserve', 'v1');
  if (!existsSync(dir)) {
    throw new Error(
      `greenserve protos not found in ${dir}; run from a checkout of the repository or set GREENSERVE_PROTOS_DIR`,
    );
  }
  return readdirSync(dir)
    .filter((name) => name.endsWith('.proto'))
    .sort()
    .map((name) => `greenserve/v1/${name}`);
}

const contractCache = new Map();

/**
 * Loads every proto of greenserve.v1 and returns the `greenserve.v1` namespace of the grpc object:
 * service client constructors (`OptimizerService`, `RouterService`, ...) and message type definitions.
 * The result is cached per protos folder.
 * @param {{protosDir?: string}} [options]
 */
export function loadGreenserve({ protosDir = PROTOS_DIR } = {}) {
  const key = path.resolve(protosDir);
  let loaded = contractCache.get(key);
  if (!loaded) {
    // google/protobuf/*.proto (Timestamp, ...) resolve to the definitions bundled with protobufjs.
    const packageDefinition = protoLoader.loadSync(greenserveProtoFiles(key), {
      ...LOADER_OPTIONS,
      includeDirs: [key],
    });
    loaded = grpc.loadPackageDefinition(packageDefinition).greenserve.v1;
    contractCache.set(key, loaded);
  }
  return loaded;
}

let healthCache;

/** Loads grpc.health.v1 from this package's own copy of health.proto; returns its namespace. */
export function loadHealth() {
  if (!healthCache) {
    const packageDefinition = protoLoader.loadSync('grpc/health/v1/health.proto', {
      ...LOADER_OPTIONS,
      includeDirs: [CLIENT_PROTO_DIR],
    });
    healthCache = grpc.loadPackageDefinition(packageDefinition).grpc.health.v1;
  }
  return healthCache;
}

/**
 * Methods of a loaded service: name -> {path, requestStream, responseStream, kind}.
 * kind is "unary", "server_streaming", "client_streaming" or "bidi_streaming".
 * @param {string} serviceName e.g. "RouterService" or "greenserve.v1.RouterService"
 */
export function describeService(serviceName, options = {}) {
  const Ctor = serviceConstructor(serviceName, options);
  return Object.fromEntries(
    Object.entries(Ctor.service).map(([name, def]) => [
      name,
      {
        path: def.path,
        requestStream: def.requestStream,
        responseStream: def.responseStream,
        kind: methodKind(def),
      },
    ]),
  );
}

function serviceConstructor(serviceName, options = {}) {
  const shortName = String(serviceName).replace(/^greenserve\.v1\./, '');
  const v1 = loadGreenserve(options);
  const Ctor = v1[shortName];
  if (typeof Ctor !== 'function' || !Ctor.service) {
    const known = Object.keys(v1).filter((k) => typeof v1[k] === 'function' && v1[k].service);
    throw new TypeError(`unknown greenserve service "${serviceName}"; known: ${known.join(', ')}`);
  }
  return Ctor;
}

function methodKind(def) {
  if (def.requestStream && def.responseStream) return 'bidi_streaming';
  if (def.requestStream) return 'client_streaming';
  if (def.responseStream) return 'server_streaming';
  return 'unary';
}

// ---------------------------------------------------------------------------------------------------
// Credentials

/**
 * Client interceptor adding `authorization: Bearer <token>` to the metadata of every call. Used on
 * insecure channels, where grpc-js does not allow call credentials.
 * @param {string} token
 */
export function bearerTokenInterceptor(token) {
  const value = bearerValue(token);
  return (options, nextCall) =>
    new grpc.InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        metadata.set(AUTHORIZATION_KEY, value);
        next(metadata, listener);
      },
    });
}

/**
 * Call credentials adding `authorization: Bearer <token>`; compose them with TLS channel credentials.
 * @param {string} token
 */
export function bearerTokenCallCredentials(token) {
  const value = bearerValue(token);
  return grpc.credentials.createFromMetadataGenerator((_params, callback) => {
    const metadata = new grpc.Metadata();
    metadata.set(AUTHORIZATION_KEY, value);
    callback(null, metadata);
  });
}

function bearerValue(token) {
  if (typeof token !== 'string' || token.trim() === '') {
    throw new TypeError('token must be a non-empty string');
  }
  if (/[^\x20-\x7e]/.test(token)) {
    throw new TypeError('token must be printable ASCII');
  }
  return `Bearer ${token}`;
}

// A Buffer is used as is; a string holding PEM text is used as is; any other string is a file path.
function readPem(value, what) {
  if (value === undefined || value === null || value === '') return null;
  if (Buffer.isBuffer(value)) return value;
  if (typeof value === 'string') {
    if (value.includes('-----BEGIN')) return Buffer.from(value);
    try {
      return readFileSync(value);
    } catch (err) {
      throw new Error(`cannot read TLS ${what} from ${value}: ${err.message}`);
    }
  }
  throw new TypeError(`TLS ${what} must be a Buffer, PEM text or a file path`);
}

/**
 * Builds channel credentials, channel options and interceptors from client options.
 * @param {{token?: string, tls?: boolean|{ca?, cert?, key?, serverName?: string}}} options
 */
export function buildCredentials({ token, tls } = {}) {
  const channelOptions = {};
  const interceptors = [];
  let credentials;
  if (tls) {
    const t = tls === true ? {} : tls;
    const ca = readPem(t.ca, 'ca');
    const cert = readPem(t.cert, 'cert');
    const key = readPem(t.key, 'key');
    if (Boolean(cert) !== Boolean(key)) {
      throw new TypeError('tls.cert and tls.key must be given together (mTLS)');
    }
    credentials = grpc.credentials.createSsl(ca, key, cert);
    if (t.serverName) {
      channelOptions['grpc.ssl_target_name_override'] = t.serverName;
      channelOptions['grpc.default_authority'] = t.serverName;
    }
    if (token) {
      credentials = grpc.credentials.combineChannelCredentials(
        credentials,
        bearerTokenCallCredentials(token),
      );
    }
  } else {
    credentials = grpc.credentials.createInsecure();
    if (token) interceptors.push(bearerTokenInterceptor(token));
  }
  return { credentials, channelOptions, interceptors };
}

// ---------------------------------------------------------------------------------------------------
// Errors

let statusRootCache;

function statusRoot(protosDir = PROTOS_DIR) {
  if (!statusRootCache) {
    const includeDirs = [path.resolve(protosDir), CLIENT_PROTO_DIR];
    const root = new protobuf.Root();
    const fallback = root.resolvePath.bind(root);
    root.resolvePath = (origin, target) => {
      for (const dir of includeDirs) {
        const candidate = path.join(dir, target);
        if (existsSync(candidate)) return candidate;
      }
      return fallback(origin, target);
    };
    root.loadSync(['google/rpc/status.proto', 'greenserve/v1/common.proto'], { keepCase: true });
    root.resolveAll();
    statusRootCache = root;
  }
  return statusRootCache;
}

const TO_OBJECT = { longs: String, enums: String, defaults: true, oneofs: true };

/**
 * protobufjs types of google.rpc.Status and greenserve.v1.ErrorDetail, e.g. for a Node server or a
 * test that builds a `grpc-status-details-bin` trailer.
 * @returns {{Status: protobuf.Type, ErrorDetail: protobuf.Type, errorDetailTypeUrl: string}}
 */
export function errorStatusTypes() {
  const root = statusRoot();
  return {
    Status: root.lookupType('google.rpc.Status'),
    ErrorDetail: root.lookupType(ERROR_DETAIL_TYPE),
    errorDetailTypeUrl: `type.googleapis.com/${ERROR_DETAIL_TYPE}`,
  };
}

/**
 * Decodes the `grpc-status-details-bin` trailer of a failed call: the greenserve.v1.ErrorDetail
 * entries (as plain objects: {reason, field, message, service}); other detail types are returned as
 * {type_url}. Returns [] when there is no such trailer.
 * @param {grpc.Metadata|undefined} metadata
 */
export function decodeErrorDetails(metadata) {
  const raw = metadata?.get?.('grpc-status-details-bin')?.[0];
  if (!raw) return [];
  const { Status, ErrorDetail } = errorStatusTypes();
  const status = Status.decode(Buffer.isBuffer(raw) ? raw : Buffer.from(raw));
  return status.details.map((any) => {
    if (any.type_url === ERROR_DETAIL_TYPE || any.type_url.endsWith(`/${ERROR_DETAIL_TYPE}`)) {
      return ErrorDetail.toObject(ErrorDetail.decode(any.value), TO_OBJECT);
    }
    return { type_url: any.type_url };
  });
}

/** Name of a gRPC status code ("INVALID_ARGUMENT" for 3). */
export function statusName(code) {
  return grpc.status[code] ?? `CODE_${code}`;
}

/**
 * Adds `codeName` and `errorDetails` to a grpc-js call error (in place) and returns it.
 * @param {Error & {code?: number, details?: string, metadata?: grpc.Metadata}} err
 */
export function enrichError(err) {
  if (!err || typeof err.code !== 'number' || 'codeName' in err) return err;
  err.codeName = statusName(err.code);
  try {
    err.errorDetails = decodeErrorDetails(err.metadata);
  } catch {
    err.errorDetails = [];
  }
  return err;
}

/** One-line description of an error: "INVALID_ARGUMENT: message [field energy_kwh]". */
export function formatError(err) {
  if (!err || typeof err.code !== 'number') return String(err?.stack ?? err);
  enrichError(err);
  const fields = (err.errorDetails ?? []).map((d) => d.field).filter(Boolean);
  const suffix = fields.length ? ` [field ${fields.join(', ')}]` : '';
  return `${err.codeName}: ${err.details ?? err.message}${suffix}`;
}

// ---------------------------------------------------------------------------------------------------
// Clients

function toMetadata(extra) {
  if (extra instanceof grpc.Metadata) return extra.clone();
  const metadata = new grpc.Metadata();
  for (const [key, value] of Object.entries(extra ?? {})) {
    for (const v of Array.isArray(value) ? value : [value]) metadata.add(key, v);
  }
  return metadata;
}

function callOptions(callOpts, defaultDeadlineMs, { applyDefault }) {
  const options = {};
  if (callOpts.deadline instanceof Date || typeof callOpts.deadline === 'number') {
    options.deadline = callOpts.deadline;
  } else {
    const ms = callOpts.deadlineMs ?? (applyDefault ? defaultDeadlineMs : undefined);
    if (ms !== undefined && ms !== null && ms !== Infinity) {
      options.deadline = new Date(Date.now() + ms);
    }
  }
  return options;
}

function bindAbort(call, signal) {
  if (!signal) return;
  if (signal.aborted) {
    call.cancel();
    return;
  }
  const onAbort = () => call.cancel();
  signal.addEventListener('abort', onAbort, { once: true });
  call.on('status', () => signal.removeEventListener('abort', onAbort));
}

function wrapMethod(raw, name, def, defaultDeadlineMs, streamDeadlineMs) {
  const fn = raw[name].bind(raw);
  switch (methodKind(def)) {
    case 'unary':
      // (request, {deadlineMs, deadline, metadata, signal}) -> Promise<response>
      return (request = {}, callOpts = {}) =>
        new Promise((resolve, reject) => {
          const call = fn(
            request,
            toMetadata(callOpts.metadata),
            callOptions(callOpts, defaultDeadlineMs, { applyDefault: true }),
            (err, response) => (err ? reject(enrichError(err)) : resolve(response)),
          );
          bindAbort(call, callOpts.signal);
        });
    case 'server_streaming':
      // (request, callOpts) -> ClientReadableStream (async-iterable); no deadline unless given.
      return (request = {}, callOpts = {}) => {
        const call = fn(
          request,
          toMetadata(callOpts.metadata),
          callOptions(callOpts, streamDeadlineMs, { applyDefault: true }),
        );
        call.on('error', enrichError);
        bindAbort(call, callOpts.signal);
        return call;
      };
    case 'client_streaming':
      // (callOpts) -> ClientWritableStream with a `response` promise; write(), end(), await response.
      return (callOpts = {}) => {
        let call;
        const response = new Promise((resolve, reject) => {
          call = fn(
            toMetadata(callOpts.metadata),
            callOptions(callOpts, streamDeadlineMs, { applyDefault: true }),
            (err, res) => (err ? reject(enrichError(err)) : resolve(res)),
          );
        });
        response.catch(() => {}); // the caller sees the rejection through `call.response`
        call.response = response;
        bindAbort(call, callOpts.signal);
        return call;
      };
    default:
      // (callOpts) -> ClientDuplexStream
      return (callOpts = {}) => {
        const call = fn(
          toMetadata(callOpts.metadata),
          callOptions(callOpts, streamDeadlineMs, { applyDefault: true }),
        );
        call.on('error', enrichError);
        bindAbort(call, callOpts.signal);
        return call;
      };
  }
}

function wrapClient(Ctor, address, options, label) {
  if (typeof address !== 'string' || address === '') {
    throw new TypeError('address must be a "host:port" string');
  }
  const { credentials, channelOptions, interceptors } = buildCredentials(options);
  const raw = new Ctor(address, credentials, {
    ...channelOptions,
    ...(options.channelOptions ?? {}),
    interceptors: [...interceptors, ...(options.interceptors ?? [])],
  });
  const deadlineMs = options.deadlineMs ?? DEFAULT_DEADLINE_MS;
  const client = {
    raw,
    service: label,
    address,
    /** Closes the channel. */
    close: () => raw.close(),
    /** Resolves once the channel is connected (rejects after `ms`). */
    waitForReady: (ms = deadlineMs) =>
      new Promise((resolve, reject) =>
        raw.waitForReady(new Date(Date.now() + ms), (err) => (err ? reject(err) : resolve())),
      ),
  };
  for (const [name, def] of Object.entries(Ctor.service)) {
    const method = wrapMethod(raw, name, def, deadlineMs, options.streamDeadlineMs);
    client[name] = method;
    const alias = def.originalName; // camelCase, e.g. estimateCarbon
    if (alias && !(alias in client)) client[alias] = method;
  }
  return client;
}

/**
 * Creates a client of one greenserve.v1 service.
 *
 * Unary methods return promises; server-streaming methods return async-iterable streams; client-
 * streaming methods return a writable call with a `response` promise. Each method is available
 * under its proto name (`EstimateCarbon`) and in camelCase (`estimateCarbon`); each takes per-call
 * options `{deadlineMs, deadline, metadata, signal}`.
 *
 * @param {string} serviceName "OptimizerService" or "greenserve.v1.OptimizerService"
 * @param {string} address "host:port"
 * @param {{
 *   token?: string,
 *   tls?: boolean | {ca?: Buffer|string, cert?: Buffer|string, key?: Buffer|string, serverName?: string},
 *   deadlineMs?: number,
 *   streamDeadlineMs?: number,
 *   channelOptions?: object,
 *   interceptors?: Function[],
 *   protosDir?: string,
 * }} [options] `tls` values are Buffers, PEM text or file paths; `tls: true` uses the system roots.
 *   `deadlineMs` (default 10 s) applies to unary calls; streams get `streamDeadlineMs` (default none).
 */
export function createClient(serviceName, address, options = {}) {
  const Ctor = serviceConstructor(serviceName, options);
  return wrapClient(Ctor, address, options, `${PROTO_PACKAGE}.${Ctor.serviceName}`);
}

/**
 * Creates a client of the standard grpc.health.v1.Health service (Check, Watch).
 * @param {string} address
 * @param {object} [options] as for createClient
 */
export function createHealthClient(address, options = {}) {
  const { Health } = loadHealth();
  return wrapClient(Health, address, options, 'grpc.health.v1.Health');
}

/**
 * Calls grpc.health.v1.Health/Check and resolves to the serving status name ("SERVING",
 * "NOT_SERVING", "UNKNOWN", "SERVICE_UNKNOWN"). Rejects with NOT_FOUND when the server does not
 * know the service, and with UNAVAILABLE when it cannot be reached.
 * @param {string} address
 * @param {string} [service] fully-qualified service name; "" for the server as a whole
 * @param {object} [options] as for createClient
 */
export async function checkHealth(address, service = '', options = {}) {
  const client = createHealthClient(address, options);
  try {
    const response = await client.Check({ service });
    return response.status;
  } catch (err) {
    if (err?.code === grpc.status.NOT_FOUND && !err.details) {
      err.details = `the server does not know service "${service}"`;
    }
    throw err;
  } finally {
    client.close();
  }
}

export { grpc };
