<?php
// A PHP webhook endpoint as Laravel and plain PHP backends write it with
// Pusher's PHP SDK (pusher/pusher-php-server): `$pusher->webhook(getallheaders(),
// file_get_contents('php://input'))`. That SDK reads the two headers from
// getallheaders() by their exact names, `X-Pusher-Key` and `X-Pusher-Signature`
// (getallheaders() keeps the case the sender used), then compares the key and
// the hex HMAC-SHA256 of the raw body with the app secret. The SDK itself is
// served only by Packagist and its public repository, which this project's
// machines cannot reach; this endpoint does what its check does.
//
// Run under PHP's own web server (`php -S HOST:PORT webhook.php`, where
// getallheaders() is what a web server gives PHP), with APP_KEY and APP_SECRET
// set. Each request's verdict is one JSON line on the server's stdout.

$headers = getallheaders();
$body = file_get_contents('php://input');

function verdict(array $headers, string $body): array
{
    // Exactly the SDK's reads: an absent key is null, not a case-insensitive match.
    $key = $headers['X-Pusher-Key'] ?? null;
    $signature = $headers['X-Pusher-Signature'] ?? null;
    if ($key !== getenv('APP_KEY')) {
        return [false, 'X-Pusher-Key ' . json_encode($key) . ' is not the app key'];
    }
    $expected = hash_hmac('sha256', $body, getenv('APP_SECRET'));
    if ($expected !== $signature) {
        return [false, 'invalid signature: got ' . json_encode($signature)];
    }
    return [true, null];
}

[$valid, $why] = verdict($headers, $body);
[$tampered_valid] = verdict($headers, preg_replace('/\}/', ' }', $body, 1));
$decoded = json_decode($body, true);
file_put_contents('php://stdout', json_encode([
    'webhook' => [
        'valid' => $valid,
        'why' => $why,
        'tampered_valid' => $tampered_valid,
        'header_names' => array_keys($headers),
        'events' => $valid ? $decoded['events'] : [],
    ],
]) . "\n");
http_response_code($valid ? 200 : 401);
