// Compiled by `tsc --noEmit` against the installed package (node_package_test): the
// declarations (index.d.ts) must describe a typical use; nothing here runs.
import {AttentionClient, AttentionError, ModelVersionState, RepositoryModel, ReplayingSession,
        Tensor, bool, float32, toFloat32} from 'attention-client';

async function use(target: string): Promise<number> {
  const client = new AttentionClient(target, {tlsCaFile: 'ca.pem', tokenFile: 'token',
                                              deadlineMs: 5000, lbPolicy: 'pick_first'});
  const ready: boolean = await client.waitReady(10000);
  const model = await client.getModel();
  const query: Tensor = float32(new Float32Array(8 * model.embedDim), [1, 8, model.embedDim]);
  const mask: Tensor = bool([false, false, true, true, false, false, false, false], [1, 8]);
  try {
    const r = await client.infer({query, keyPaddingMask: mask, isCausal: true, needWeights: true,
                                  outputDtype: 'bfloat16', modelVersion: model.version});
    const values: Float32Array = toFloat32(r.output!);
    const version: number = r.modelVersion;
    const states: ModelVersionState[] = (await client.getModel(model.name, version)).versions;
    const index: RepositoryModel[] = await client.repositoryIndex(true);
    const serving: number[] = await client.loadModel(index[0].name);
    await client.unloadModel(model.name);
    console.log(states.map((s) => `${s.version}:${s.state} ${s.reason}`), serving, model.batchFirst);
    for await (const s of client.inferStream([{query, requestId: 'a'}, {query}])) {
      if (s.error) console.log(s.error.codeName, s.error.hint);
      else console.log(s.requestId, s.output?.shape, s.batchRequests);
    }
    const session: ReplayingSession = await client.session({replay: true, ttlS: 60});
    const step = await session.append(float32(new Float32Array(model.embedDim), [1, model.embedDim]));
    const info = await session.info();
    const freed: number = await session.close();
    const plain = await client.session({kind: 'cross', key: query, value: query});
    console.log(values.length, step.length, info.bytes, freed, session.recoveries, plain.length,
                (await client.models()).map((m) => m.batching.maxBatchSize), await client.health());
  } catch (err) {
    if (err instanceof AttentionError) return err.code;
    throw err;
  } finally {
    client.close();
  }
  return ready ? 0 : 1;
}

use('localhost:50051').then((code) => process.exit(code));
