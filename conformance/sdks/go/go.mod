module herald/conformance/sdks/go

go 1.22

require github.com/pusher/pusher-http-go/v5 v5.1.1

require (
	golang.org/x/crypto v0.0.0-20200709230013-948cd5f35899 // indirect
	golang.org/x/sys v0.0.0-20190412213103-97732733099d // indirect
)
