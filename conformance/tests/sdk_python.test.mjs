// Python's official server SDK (`pusher` 3.3.4 from PyPI) against a real herald,
// driven through conformance/sdks/python (conformance/lib/sdk_suite.mjs has the checks).
import { sdkSuite } from '../lib/sdk_suite.mjs';

sdkSuite('python', { terminate: true, userAuth: true });
