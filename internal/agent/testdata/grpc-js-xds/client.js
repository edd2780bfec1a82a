// A stock @grpc/grpc-js-xds client, as a Node application would use it:
// the bootstrap named by GRPC_XDS_BOOTSTRAP (insecure channel
// credentials, no call credentials: muster agent on loopback), the
// target xds:///SERVICE, plain insecure credentials for the backends.
// It calls grpc.testing.TestService/UnaryCall back to back, every
// INTERVAL_MS, and prints one JSON line per call: {"id": SERVER_ID} or
// {"err": "CODE DETAILS"}. It runs until killed.
//
// With "tally" in place of INTERVAL_MS it makes no call on its own: for
// each line N read from stdin it makes N calls (a few in flight at a
// time, as an application under load would) and prints one JSON line,
// {"tally": {SERVER_ID: CALLS, ...}, "errs": ["CODE DETAILS", ...]},
// so one client (one channel, one xDS stream) is measured again and
// again as its assignment changes.
'use strict';
const grpc = require('@grpc/grpc-js');
require('@grpc/grpc-js-xds').register();

const target = process.argv[2];
const interval = Number(process.argv[3] || 5);

const identity = (b) => b;
const Client = grpc.makeGenericClientConstructor({
  UnaryCall: {
    path: '/grpc.testing.TestService/UnaryCall', requestStream: false, responseStream: false,
    requestSerialize: identity, requestDeserialize: identity,
    responseSerialize: identity, responseDeserialize: identity,
  },
}, 'TestService');
const client = new Client(target, grpc.credentials.createInsecure());

// serverId reads field 4 (server_id, a string) of a SimpleResponse.
function serverId(buf) {
  let i = 0;
  const varint = () => {
    let v = 0, shift = 0, b;
    do { b = buf[i++]; v += (b & 0x7f) * 2 ** shift; shift += 7; } while (b & 0x80);
    return v;
  };
  while (i < buf.length) {
    const key = varint(), field = Math.floor(key / 8), wire = key & 7;
    if (wire === 0) { varint(); continue; }
    if (wire === 1) { i += 8; continue; }
    if (wire === 5) { i += 4; continue; }
    const n = varint();
    if (field === 4 && wire === 2) return buf.subarray(i, i + n).toString('utf8');
    i += n;
  }
  return '';
}

function tally(n) {
  return new Promise((resolve) => {
    const counts = {}, errs = [];
    let started = 0, done = 0;
    const one = () => {
      if (started === n) return;
      started++;
      const deadline = new Date(Date.now() + 2000);
      client.UnaryCall(Buffer.alloc(0), { deadline }, (err, res) => {
        if (err) errs.push(`${err.code} ${err.details}`);
        else { const id = serverId(res); counts[id] = (counts[id] || 0) + 1; }
        if (++done === n) resolve({ tally: counts, errs });
        else one();
      });
    };
    if (n === 0) resolve({ tally: counts, errs });
    for (let i = 0; i < Math.min(n, 8); i++) one();
  });
}

if (process.argv[3] === 'tally') {
  let buf = '', queue = Promise.resolve();
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (chunk) => {
    buf += chunk;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const n = Number(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
      queue = queue.then(() => tally(n)).then((r) => process.stdout.write(JSON.stringify(r) + '\n'));
    }
  });
  process.stdin.on('end', () => queue.then(() => process.exit(0)));
  return;
}

function call() {
  const deadline = new Date(Date.now() + 2000);
  client.UnaryCall(Buffer.alloc(0), { deadline }, (err, res) => {
    process.stdout.write(JSON.stringify(err ? { err: `${err.code} ${err.details}` } : { id: serverId(res) }) + '\n');
    setTimeout(call, interval);
  });
}
call();
