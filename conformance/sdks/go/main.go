// Go's official Pusher server SDK (github.com/pusher/pusher-http-go/v5)
// driven by the conformance suite (conformance/lib/sdk.mjs): one JSON request
// a line on stdin, one JSON answer a line on stdout, and a webhook receiver
// whose requests are checked with the SDK's own validator (Client.Webhook).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"sync"

	pusher "github.com/pusher/pusher-http-go/v5"
)

var (
	client = pusher.Client{
		AppID:  os.Getenv("APP_ID"),
		Key:    os.Getenv("APP_KEY"),
		Secret: os.Getenv("APP_SECRET"),
		Host:   net.JoinHostPort(os.Getenv("HERALD_HOST"), os.Getenv("HERALD_PORT")),
		Secure: false,
	}
	outMu sync.Mutex
)

func say(message any) {
	line, _ := json.Marshal(message)
	outMu.Lock()
	defer outMu.Unlock()
	os.Stdout.Write(append(line, '\n'))
}

// webhook checks a request as a Go backend does: Client.Webhook with the
// request's headers (http.Header, read by canonical name) and raw body.
func webhook(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	checked, err := client.Webhook(r.Header, body)
	_, tamperedErr := client.Webhook(r.Header, bytes.Replace(body, []byte("}"), []byte(" }"), 1))
	note := map[string]any{"valid": err == nil, "tampered_valid": tamperedErr == nil}
	if err == nil {
		note["events"] = checked.Events
	} else {
		var raw map[string]any
		_ = json.Unmarshal(body, &raw)
		note["events"] = raw["events"]
		note["error"] = err.Error()
	}
	w.WriteHeader(200)
	say(map[string]any{"webhook": note})
}

type request struct {
	ID       int               `json:"id"`
	Op       string            `json:"op"`
	Channels []string          `json:"channels"`
	Channel  string            `json:"channel"`
	Event    string            `json:"event"`
	Data     map[string]any    `json:"data"`
	Batch    []batchEvent      `json:"batch"`
	Info     string            `json:"info"`
	Prefix   string            `json:"prefix"`
	SocketID string            `json:"socket_id"`
	UserID   string            `json:"user_id"`
	UserInfo map[string]string `json:"user_info"`
	User     map[string]any    `json:"user"`
}

type batchEvent struct {
	Channel string         `json:"channel"`
	Name    string         `json:"name"`
	Data    map[string]any `json:"data"`
}

// raw is an authorization answer, passed on as the JSON the SDK made.
func raw(b []byte, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	return json.RawMessage(b), nil
}

func handle(req request) (any, error) {
	switch req.Op {
	case "trigger":
		return map[string]any{}, client.TriggerMulti(req.Channels, req.Event, req.Data)
	case "trigger_batch":
		batch := make([]pusher.Event, 0, len(req.Batch))
		for _, e := range req.Batch {
			batch = append(batch, pusher.Event{Channel: e.Channel, Name: e.Name, Data: e.Data})
		}
		_, err := client.TriggerBatch(batch)
		return map[string]any{}, err
	case "channel":
		ch, err := client.Channel(req.Channel, pusher.ChannelParams{Info: &req.Info})
		if err != nil {
			return nil, err
		}
		return map[string]any{"occupied": ch.Occupied, "user_count": ch.UserCount}, nil
	case "channels":
		list, err := client.Channels(pusher.ChannelsParams{FilterByPrefix: &req.Prefix})
		if err != nil {
			return nil, err
		}
		names := []string{}
		for name := range list.Channels {
			names = append(names, name)
		}
		sort.Strings(names)
		return map[string]any{"channels": names}, nil
	case "users":
		users, err := client.GetChannelUsers(req.Channel)
		if err != nil {
			return nil, err
		}
		ids := []string{}
		for _, u := range users.List {
			ids = append(ids, u.ID)
		}
		return map[string]any{"ids": ids}, nil
	case "auth":
		// The form body pusher-js posts to an auth endpoint.
		params := []byte(url.Values{"socket_id": {req.SocketID}, "channel_name": {req.Channel}}.Encode())
		if req.UserID != "" {
			return raw(client.AuthorizePresenceChannel(params, pusher.MemberData{UserID: req.UserID, UserInfo: req.UserInfo}))
		}
		return raw(client.AuthorizePrivateChannel(params))
	case "user_auth":
		params := []byte(url.Values{"socket_id": {req.SocketID}}.Encode())
		return raw(client.AuthenticateUser(params, req.User))
	}
	return nil, fmt.Errorf("unknown op %q", req.Op)
}

func main() {
	listener, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", os.Getenv("WEBHOOK_PORT")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go http.Serve(listener, http.HandlerFunc(webhook))
	say(map[string]any{"ready": true})
	lines := bufio.NewScanner(os.Stdin)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	for lines.Scan() {
		var req request
		if err := json.Unmarshal(lines.Bytes(), &req); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		result, err := handle(req)
		if err != nil {
			say(map[string]any{"id": req.ID, "error": err.Error()})
		} else {
			say(map[string]any{"id": req.ID, "ok": result})
		}
	}
}
