// Package responses is the state of OpenAI's Responses API (/v1/responses): the
// responses a server stores, the conversation previous_response_id continues, and the
// background responses running in this process. It sits below package api, which owns
// the handlers and the generation, and above api/openai (the wire types it stores) and
// api/respstore (the embedded database it stores them in).
//
// # Stored responses
//
// A Runtime is built over a respstore.Store (Config.Store) or over none. A stored
// response is a Stored record: the response object, this request's input items and the
// conversation before them, so that GET returns it, input_items pages its input
// (Stored.InputPage), and a later request continues it (Lookup: context, input and
// output, in order). The handlers write a response once it ends, before its last event
// or its body is sent, so that a client that got it can continue from it at once.
// Without a store, store:true (OpenAI's default; Config.NoStoreByDefault turns it off),
// background and previous_response_id are 400s that give Config.Unavailable as the
// reason, and GET and DELETE find nothing. A response too large for the store's record
// limit is refused before anything is generated (CheckStorable); a write that fails
// anyway (a full disk) fails the response with the cause and not the server's paths.
//
// # Background responses
//
// Start stores a background response as queued and runs its generation on a goroutine:
// the response is stored again as in_progress when it starts and once more when it ends,
// completed, incomplete, failed, or cancelled by Cancel or Delete (which wait until that
// last write is done). The generation runs under a context its caller made for it — the
// starting request's, without its cancellation, since the response outlives the request
// — and the runtime holds only the function that cancels it. Shutdown lets running
// responses finish until its context ends, then cancels them (they are stored as failed)
// and waits; no response starts once it has begun (openai.ErrNotReady). A response the store
// holds as queued or in progress when New opens it was left so by a process that ended
// before it finished: it is stored as failed (RestartFailure).
//
// # Example
//
//	rt := responses.New(responses.Config{Store: st}, log)
//	defer rt.Shutdown(ctx)
//	queued, err := rt.Start(sr, cancel, func() { generate(runCtx, &sr.Response) })
//	...
//	sr, err := rt.Get(id) // openai.ErrNotFound for an unknown id
package responses
