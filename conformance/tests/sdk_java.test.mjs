// Java's official server SDK (com.pusher:pusher-http-java 1.3.4) and client (com.pusher:pusher-java-client 2.4.4) against a real herald,
// driven through conformance/sdks/java (conformance/lib/sdk_suite.mjs has the checks).
import { sdkSuite } from '../lib/sdk_suite.mjs';

sdkSuite('java', { client: true });
