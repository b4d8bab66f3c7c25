package herald.sdk;

import com.google.gson.Gson;
import com.google.gson.JsonObject;
import com.pusher.client.PusherOptions;
import com.pusher.client.channel.Channel;
import com.pusher.client.channel.PrivateChannelEventListener;
import com.pusher.client.channel.PusherEvent;
import com.pusher.client.connection.ConnectionEventListener;
import com.pusher.client.connection.ConnectionState;
import com.pusher.client.connection.ConnectionStateChange;
import com.pusher.rest.Pusher;
import com.pusher.rest.data.Event;
import com.pusher.rest.data.PresenceUser;
import com.pusher.rest.data.Result;
import com.pusher.rest.data.Validity;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * Java's official Pusher server SDK (com.pusher:pusher-http-java) and client
 * (com.pusher:pusher-java-client) driven by the conformance suite
 * (conformance/lib/sdk.mjs): one JSON request a line on stdin, one JSON
 * answer a line on stdout, a webhook receiver whose requests are checked with
 * the server SDK's own validator, and a client whose events are reported as
 * they arrive.
 */
public final class Main {
  private static final Gson GSON = new Gson();
  private static final String HOST = System.getenv("HERALD_HOST");
  private static final int PORT = Integer.parseInt(System.getenv("HERALD_PORT"));
  private static final Pusher SERVER =
      new Pusher(System.getenv("APP_ID"), System.getenv("APP_KEY"), System.getenv("APP_SECRET"));
  private static com.pusher.client.Pusher client;

  private static synchronized void say(Object message) {
    System.out.println(GSON.toJson(message));
    System.out.flush();
  }

  private static Map<String, Object> map(Object... kv) {
    Map<String, Object> m = new LinkedHashMap<>();
    for (int i = 0; i < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
    return m;
  }

  /** A webhook checked as a Java backend does: the two headers by name, the raw body. */
  private static void webhook(HttpExchange exchange) throws java.io.IOException {
    String body = new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
    String key = exchange.getRequestHeaders().getFirst("X-Pusher-Key");
    String signature = exchange.getRequestHeaders().getFirst("X-Pusher-Signature");
    Validity validity = SERVER.validateWebhookSignature(key, signature, body);
    Validity tampered = SERVER.validateWebhookSignature(key, signature, body.replaceFirst("\\}", " }"));
    exchange.sendResponseHeaders(200, -1);
    exchange.close();
    JsonObject parsed = GSON.fromJson(body, JsonObject.class);
    say(
        map(
            "webhook",
            map(
                "valid", validity == Validity.VALID,
                "tampered_valid", tampered == Validity.VALID,
                "validity", validity.toString(),
                "events", parsed.get("events"))));
  }

  private static Object ok(Result result) {
    if (result.getStatus() != Result.Status.SUCCESS) {
      throw new IllegalStateException(result.getStatus() + " " + result.getHttpStatus() + ": " + result.getMessage());
    }
    return result.getMessage() == null || result.getMessage().isEmpty()
        ? map()
        : GSON.fromJson(result.getMessage(), JsonObject.class);
  }

  @SuppressWarnings("unchecked")
  private static Object handle(JsonObject req) throws Exception {
    String op = req.get("op").getAsString();
    switch (op) {
      case "trigger": {
        List<String> channels = GSON.fromJson(req.get("channels"), List.class);
        return ok(SERVER.trigger(channels, req.get("event").getAsString(), GSON.fromJson(req.get("data"), Map.class)));
      }
      case "trigger_batch": {
        List<Event> batch = new ArrayList<>();
        for (var e : req.getAsJsonArray("batch")) {
          JsonObject o = e.getAsJsonObject();
          batch.add(new Event(o.get("channel").getAsString(), o.get("name").getAsString(), GSON.fromJson(o.get("data"), Map.class)));
        }
        return ok(SERVER.trigger(batch));
      }
      case "channel": {
        JsonObject info = (JsonObject) ok(
            SERVER.get("/channels/" + req.get("channel").getAsString(), Map.of("info", req.get("info").getAsString())));
        return map(
            "occupied", info.get("occupied").getAsBoolean(),
            "user_count", info.has("user_count") ? info.get("user_count").getAsInt() : null);
      }
      case "channels": {
        JsonObject list = (JsonObject) ok(
            SERVER.get("/channels", Map.of("filter_by_prefix", req.get("prefix").getAsString())));
        return map("channels", new TreeSet<>(list.getAsJsonObject("channels").keySet()));
      }
      case "users": {
        JsonObject users = (JsonObject) ok(SERVER.get("/channels/" + req.get("channel").getAsString() + "/users"));
        List<String> ids = new ArrayList<>();
        for (var u : users.getAsJsonArray("users")) ids.add(u.getAsJsonObject().get("id").getAsString());
        return map("ids", ids);
      }
      case "auth": {
        String socketId = req.get("socket_id").getAsString();
        String channel = req.get("channel").getAsString();
        String auth = req.has("user_id")
            ? SERVER.authenticate(socketId, channel,
                new PresenceUser(req.get("user_id").getAsString(), GSON.fromJson(req.get("user_info"), Map.class)))
            : SERVER.authenticate(socketId, channel);
        return GSON.fromJson(auth, JsonObject.class);
      }
      case "client_subscribe":
        return subscribe(req.get("channel").getAsString());
      default:
        throw new IllegalArgumentException("unknown op " + op);
    }
  }

  /** The client library, connected once; its private channels authorized by the server SDK. */
  private static synchronized com.pusher.client.Pusher client() throws InterruptedException {
    if (client != null) return client;
    PusherOptions options = new PusherOptions()
        .setHost(HOST)
        .setWsPort(PORT)
        .setUseTLS(false)
        .setChannelAuthorizer((channelName, socketId) -> SERVER.authenticate(socketId, channelName));
    client = new com.pusher.client.Pusher(System.getenv("APP_KEY"), options);
    CountDownLatch connected = new CountDownLatch(1);
    client.connect(
        new ConnectionEventListener() {
          @Override
          public void onConnectionStateChange(ConnectionStateChange change) {
            if (change.getCurrentState() == ConnectionState.CONNECTED) connected.countDown();
          }

          @Override
          public void onError(String message, String code, Exception e) {
            System.err.println("client error: " + message + " " + code + " " + e);
          }
        },
        ConnectionState.ALL);
    if (!connected.await(10, TimeUnit.SECONDS)) throw new IllegalStateException("the client did not connect");
    return client;
  }

  /** Subscribe the client; answers once the subscription succeeded, reports each event after. */
  private static Object subscribe(String name) throws Exception {
    CountDownLatch done = new CountDownLatch(1);
    String[] failure = new String[1];
    PrivateChannelEventListener listener = new PrivateChannelEventListener() {
      @Override
      public void onSubscriptionSucceeded(String channelName) {
        done.countDown();
      }

      @Override
      public void onAuthenticationFailure(String message, Exception e) {
        failure[0] = message + " " + e;
        done.countDown();
      }

      @Override
      public void onEvent(PusherEvent event) {
        say(map("client_event", map("channel", event.getChannelName(), "event", event.getEventName(), "data", event.getData())));
      }
    };
    Channel channel = name.startsWith("private-") ? client().subscribePrivate(name, listener) : client().subscribe(name, listener);
    channel.bindGlobal(listener);
    if (!done.await(10, TimeUnit.SECONDS)) throw new IllegalStateException("no subscription_succeeded for " + name);
    if (failure[0] != null) throw new IllegalStateException(failure[0]);
    return map();
  }

  public static void main(String[] args) throws Exception {
    SERVER.setHost(HOST + ":" + PORT);
    SERVER.setEncrypted(false);
    HttpServer hooks = HttpServer.create(new InetSocketAddress("127.0.0.1", Integer.parseInt(System.getenv("WEBHOOK_PORT"))), 0);
    hooks.createContext("/", exchange -> {
      try {
        webhook(exchange);
      } catch (Exception e) {
        e.printStackTrace();
        exchange.sendResponseHeaders(500, -1);
        exchange.close();
      }
    });
    hooks.start();
    say(map("ready", true));
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    for (String line; (line = in.readLine()) != null; ) {
      JsonObject req = GSON.fromJson(line, JsonObject.class);
      Object id = req.get("id").getAsInt();
      try {
        say(map("id", id, "ok", handle(req)));
      } catch (Exception e) {
        say(map("id", id, "error", e.toString()));
      }
    }
    hooks.stop(0);
    if (client != null) client.disconnect();
    System.exit(0);
  }
}
