// Go's official server SDK (github.com/pusher/pusher-http-go/v5 v5.1.1) against a real herald,
// driven through conformance/sdks/go (conformance/lib/sdk_suite.mjs has the checks).
import { sdkSuite } from '../lib/sdk_suite.mjs';

sdkSuite('go', { userAuth: true });
