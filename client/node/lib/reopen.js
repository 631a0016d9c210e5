// Streams that outlive the server closing them, as the Python client's (attention_client
// /_reopen.py). A stream ends with UNAVAILABLE when its connection ends under it: a replica
// draining past its deadline, a proxy recycling connections, a server run with a finite
// --max_connection_age_grace_s. reopeningStream() then opens a new stream on the same client
// (so possibly to another replica), re-sends the requests sent but not answered, in the order
// they were sent, and goes on reading the caller's requests: the caller sees one stream. Only
// requests safe to send twice are re-sent (attention requests have no side effects); after
// MAX_REOPENS streams in a row that ended before any answer, or past the deadline, the error
// is thrown as before.
//
// One Outbox per logical stream, used from one event loop. A closed stream's writer may still
// be waiting on the caller's iterator when the next stream starts: every item is read exactly
// once (one read at a time), and one read for a stream already closed goes on the next.
'use strict';
const grpc = require('@grpc/grpc-js');

const MAX_REOPENS = 3;
const BACKOFF_MS = [50, 200, 500];
const END = Symbol('end');

// The id as the server echoes it (cut to its 1024-byte identifier limit).
function echoed(id) {
  return Buffer.from(String(id || ''), 'utf8').subarray(0, 1024).toString('latin1');
}

class Outbox {
  // items: an iterable or async iterable; prepare(index, item): the request of item `index`
  // (called once per item, in order); key(request): the id its answer echoes;
  // resendable(request): whether it may be sent again.
  constructor(items, prepare, key, resendable = () => true) {
    this._items = items[Symbol.asyncIterator] ? items[Symbol.asyncIterator]() :
        items[Symbol.iterator]();
    this._prepare = prepare;
    this._key = key;
    this._resendable = resendable;
    this._generation = 0;
    this._count = 0;
    this._readAll = false;
    this._reading = Promise.resolve();  // The read in progress (one at a time).
    this._resend = [];
    this._sequence = 0;
    this._unanswered = new Map();  // Send sequence -> request, in sending order.
    this._byKey = new Map();       // Key -> send sequences.
  }

  _track(request) {
    const number = this._sequence++;
    this._unanswered.set(number, request);
    const key = this._key(request);
    if (!this._byKey.has(key)) this._byKey.set(key, []);
    this._byKey.get(key).push(number);
  }

  // What stream `generation` sends next without reading: a request, END, or null (read one).
  _take(generation) {
    if (generation !== this._generation) return END;
    if (this._resend.length) return this._resend.shift();
    return this._readAll ? END : null;
  }

  async _read(generation) {
    const previous = this._reading;
    let release;
    this._reading = new Promise((r) => { release = r; });
    try {
      await previous;
      const request = this._take(generation);  // Another stream's writer may have read.
      if (request !== null) return request;
      const {value, done} = await this._items.next();
      if (done) {
        this._readAll = true;
        return END;
      }
      const prepared = this._prepare(this._count++, value);
      this._track(prepared);
      if (generation !== this._generation) {
        this._resend.push(prepared);
        return END;
      }
      return prepared;
    } finally {
      release();
    }
  }

  // Writes the requests of the stream opened now on `call`, then ends it. Rejects with the
  // caller's iterator's error (or prepare's).
  async feed(call) {
    const generation = this._generation;
    for (;;) {
      let request = this._take(generation);
      if (request === null) request = await this._read(generation);
      if (request === END) break;
      if (call.destroyed) return;
      if (!call.write(request)) {
        await new Promise((r) => { call.once('drain', r); call.once('close', r); });
      }
    }
    if (generation === this._generation && !call.destroyed) call.end();
  }

  answered(key) {
    const numbers = this._byKey.get(key);
    if (!numbers) return;
    this._unanswered.delete(numbers.shift());
    if (!numbers.length) this._byKey.delete(key);
  }

  // After the open stream ended with UNAVAILABLE: true (open a new stream; the unanswered
  // requests go first), null (nothing left to send or answer) or false (one may not be sent
  // again).
  reopen() {
    if (!this._unanswered.size && this._readAll) return null;
    for (const request of this._unanswered.values()) {
      if (!this._resendable(request)) return false;
    }
    this._generation += 1;
    this._resend = [...this._unanswered.values()];
    return true;
  }
}

// Yields the answers of one logical stream: open() opens a grpc-js duplex call; key(answer)
// gives the id it echoes; deadline (a Date) bounds every stream. Throws the grpc-js error (or
// the caller's iterator's).
async function* reopeningStream(open, outbox, key, deadline) {
  let reopens = 0;
  for (;;) {
    const call = open();
    let fed = null;
    const feeding = outbox.feed(call).catch((err) => {
      fed = err;
      call.cancel();
    });
    try {
      for await (const answer of call) {
        reopens = 0;
        outbox.answered(key(answer));
        yield answer;
      }
      await feeding;
      if (fed) throw fed;
      return;
    } catch (err) {
      if (fed) throw fed;
      const again = err.code === grpc.status.UNAVAILABLE && reopens < MAX_REOPENS &&
          Date.now() < deadline.getTime() ? outbox.reopen() : false;
      if (again === null) return;
      if (!again) throw err;
    } finally {
      call.cancel();
    }
    await new Promise((r) => setTimeout(r, BACKOFF_MS[Math.min(reopens, BACKOFF_MS.length - 1)]));
    reopens += 1;
  }
}

module.exports = {Outbox, reopeningStream, echoed, MAX_REOPENS};
