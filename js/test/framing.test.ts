// The frame codec: a batch encoded into one buffer decodes back to its
// commands, whatever the characters and wherever the stream is split.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Decoder, encode, encodeAll } from 'mlock/dist/framing';

/** A deterministic generator (mulberry32), so that a failure can be replayed from its seed. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const alphabet = ['a', 'z', '0', ' ', '|', ':', '\t', '\n', 'é', '商', '\u{1f512}', '%'];

test('encodeAll equals the frames encoded one by one, and decodes back split anywhere', () => {
  const seed = Number(process.env.MLOCK_SEED ?? Date.now() % 1e9);
  const rand = rng(seed);
  for (let round = 0; round < 300; round++) {
    const texts = Array.from({ length: 1 + Math.floor(rand() * 6) }, () =>
      Array.from({ length: Math.floor(rand() * 40) }, () => alphabet[Math.floor(rand() * alphabet.length)]).join(''),
    );
    const b = encodeAll(texts);
    assert.deepEqual(b, Buffer.concat(texts.map(encode)), `seed ${seed}, round ${round}`);
    const dec = new Decoder();
    const got: string[] = [];
    for (let off = 0; off < b.length; ) {
      const n = 1 + Math.floor(rand() * (b.length - off));
      got.push(...dec.push(b.subarray(off, off + n)));
      off += n;
    }
    assert.deepEqual(got, texts, `seed ${seed}, round ${round}`);
  }
});

test('a chunk in a reused read buffer: what the decoder keeps of it survives the buffer being overwritten', () => {
  const seed = Number(process.env.MLOCK_SEED ?? Date.now() % 1e9);
  const rand = rng(seed);
  const shared = Buffer.alloc(64);
  for (let round = 0; round < 300; round++) {
    const texts = Array.from({ length: 1 + Math.floor(rand() * 6) }, () =>
      Array.from({ length: Math.floor(rand() * 40) }, () => alphabet[Math.floor(rand() * alphabet.length)]).join(''),
    );
    const b = encodeAll(texts);
    const dec = new Decoder();
    const got: string[] = [];
    for (let off = 0; off < b.length; ) {
      const n = 1 + Math.floor(rand() * Math.min(b.length - off, shared.length));
      b.copy(shared, 0, off, off + n);
      got.push(...dec.push(shared.subarray(0, n), true));
      shared.fill(0xff); // the next read overwrites it
      off += n;
    }
    assert.deepEqual(got, texts, `seed ${seed}, round ${round}`);
  }
});
