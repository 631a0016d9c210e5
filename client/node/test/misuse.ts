// Must NOT compile (node_package_test checks that tsc rejects it): proof that the
// declarations type-check calls rather than accepting anything.
import {AttentionClient} from 'attention-client';

const client = new AttentionClient('localhost:50051', {deadlineMs: '5s'});
client.infer({query: [1, 2, 3]});
const length: string = client.maxMessageBytes;
client.loadModel({name: 'm'});
client.infer({query: {dtype: 'float32', shape: [1], data: new Float32Array(1)}, modelVersion: '2'});
client.loadModel('m').then((versions: string[]) => versions);
