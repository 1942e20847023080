package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/net/netutil"
	"golang.org/x/sync/semaphore"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/api/responses"
	"github.com/conveyor-llm/conveyor/api/webui"
)

// Config configures the HTTP server. Start from DefaultConfig.
type Config struct {
	// ModelName is the id clients put in "model" and /v1/models lists.
	ModelName string
	// APIKey, when set, is required as "Authorization: Bearer <key>" on /v1/*, /tokenize and
	// /detokenize. /health and /metrics stay open for probes and scrapers.
	APIKey string
	// MaxBodyBytes caps a request body; larger bodies get 413.
	MaxBodyBytes int64
	// MaxBodyBytesInFlight caps the request bodies being read and parsed at once, in
	// bytes: a body (its Content-Length, or MaxBodyBytes when chunked) waits for room
	// before it is read and gives it back once its request is parsed and tokenized. This
	// bounds the memory a storm of large requests takes, since parsing and tokenizing a
	// body takes several times its size. Must be at least MaxBodyBytes.
	MaxBodyBytesInFlight int64
	// BodyReadTimeout bounds reading a body once its turn has come, so a client that
	// sends it slowly cannot hold MaxBodyBytesInFlight.
	BodyReadTimeout time.Duration
	// MaxConnections caps concurrently open TCP connections; further clients wait in the
	// listen backlog.
	MaxConnections int
	// MaxHeaderBytes caps the request line and headers of a request, in bytes; a client
	// that sends more gets 431. (net/http reads up to 4096 bytes past it before refusing.)
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds reading a request's headers; a client that has not sent
	// them all by then is disconnected.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle this long.
	IdleTimeout time.Duration
	// KeepAliveInterval is how often an SSE comment is sent while a stream waits for tokens.
	KeepAliveInterval time.Duration
	// AbortGrace is how long Shutdown waits for aborted handlers to return after its deadline.
	AbortGrace time.Duration
	// EnableWebUI serves the built-in chat page at / (and /v1/engine/stats for its live view).
	EnableWebUI bool
	// Logger receives one structured line per request; nil means slog.Default().
	Logger *slog.Logger
	// Metrics is the registry /metrics serves (its OnStep, given to the engine as
	// Config.OnStep, feeds the step histograms); nil means a new one.
	Metrics *Metrics
	// Responses configures the state of /v1/responses (package api/responses).
	Responses responses.Config
}

// DefaultConfig returns the defaults used by `conveyor serve`.
func DefaultConfig() Config {
	return Config{
		ModelName:            "conveyor",
		MaxBodyBytes:         8 << 20,
		MaxBodyBytesInFlight: 64 << 20,
		BodyReadTimeout:      60 * time.Second,
		MaxConnections:       1024,
		MaxHeaderBytes:       64 << 10,
		ReadHeaderTimeout:    10 * time.Second,
		IdleTimeout:          120 * time.Second,
		KeepAliveInterval:    5 * time.Second,
		AbortGrace:           5 * time.Second,
		EnableWebUI:          true,
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.ModelName == "":
		return errors.New("api: ModelName must not be empty")
	case c.MaxBodyBytes <= 0:
		return fmt.Errorf("api: MaxBodyBytes must be > 0, got %d", c.MaxBodyBytes)
	case c.MaxBodyBytesInFlight < c.MaxBodyBytes:
		return fmt.Errorf("api: MaxBodyBytesInFlight (%d) must be at least MaxBodyBytes (%d)", c.MaxBodyBytesInFlight, c.MaxBodyBytes)
	case c.BodyReadTimeout <= 0:
		return fmt.Errorf("api: BodyReadTimeout must be > 0, got %v", c.BodyReadTimeout)
	case c.MaxConnections <= 0:
		return fmt.Errorf("api: MaxConnections must be > 0, got %d", c.MaxConnections)
	case c.MaxHeaderBytes <= 0:
		return fmt.Errorf("api: MaxHeaderBytes must be > 0, got %d", c.MaxHeaderBytes)
	case c.ReadHeaderTimeout <= 0:
		return fmt.Errorf("api: ReadHeaderTimeout must be > 0, got %v", c.ReadHeaderTimeout)
	case c.IdleTimeout <= 0:
		return fmt.Errorf("api: IdleTimeout must be > 0, got %v", c.IdleTimeout)
	case c.KeepAliveInterval <= 0:
		return fmt.Errorf("api: KeepAliveInterval must be > 0, got %v", c.KeepAliveInterval)
	case c.AbortGrace < 0:
		return fmt.Errorf("api: AbortGrace must be >= 0, got %v", c.AbortGrace)
	}
	return nil
}

// Server is the OpenAI-compatible HTTP front end. It is created before the model is
// loaded (answering 503 on /health) and becomes ready with SetBackend.
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *Metrics
	handler http.Handler
	created int64 // unix seconds, reported by /v1/models

	backend  atomic.Pointer[Backend]
	draining atomic.Bool
	// unready turns /health to 503 while everything else is still served (Unready).
	unready atomic.Bool

	// bodies holds Config.MaxBodyBytesInFlight: the bodies being read and parsed take
	// their size from it (limitBody).
	bodies *semaphore.Weighted

	// active counts generation handlers, so a forced shutdown can wait for them to return.
	active sync.WaitGroup
	// resp is the /v1/responses state: its store and the background responses running.
	resp *responses.Runtime

	mu         sync.Mutex
	httpSrv    *http.Server
	cancelBase context.CancelFunc // cancels every request context when set
}

// New builds a server; it serves nothing until Serve or Handler is used.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, metrics: cfg.Metrics, created: time.Now().Unix(),
		bodies: semaphore.NewWeighted(cfg.MaxBodyBytesInFlight)}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.metrics == nil {
		s.metrics = NewMetrics()
	}
	s.resp = responses.New(cfg.Responses, s.log)
	s.handler = s.routes()
	return s, nil
}

// SetBackend makes the server ready: model routes start answering and /health turns 200.
func (s *Server) SetBackend(b Backend) {
	s.metrics.setStatsSource(b.Engine)
	b.model = &openai.Model{Tokenizer: b.Tokenizer, MaxModelLen: b.MaxModelLen, ToolCallParser: b.ToolCallParser,
		Formats: b.Formats, Defaults: b.Defaults}
	s.backend.Store(&b)
}

// Handler returns the server's routes as an http.Handler, for a caller that serves requests
// without Serve's listener (run-batch; tests).
func (s *Server) Handler() http.Handler { return s.handler }

// Serve accepts connections on ln until Shutdown. It returns nil after a clean Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	base, cancel := context.WithCancel(context.Background())
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	s.mu.Lock()
	if s.draining.Load() {
		s.mu.Unlock()
		cancel()
		return nil
	}
	s.httpSrv, s.cancelBase = srv, cancel
	s.mu.Unlock()
	err := srv.Serve(netutil.LimitListener(ln, s.cfg.MaxConnections))
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown drains the server: /health turns 503, new generation requests get 503, the
// listener closes, and in-flight requests may finish until ctx ends. Past that deadline,
// every remaining request is aborted (streams get an in-band error, their sequences are
// aborted in the engine) and the connections are closed; ctx's error is returned then.
// The caller shuts the engine down afterwards.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	defer s.resp.Shutdown(ctx)
	s.mu.Lock()
	srv, cancel := s.httpSrv, s.cancelBase
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Shutdown(ctx)
	if err == nil {
		cancel()
		return nil
	}
	s.log.Warn("drain deadline passed; aborting in-flight requests", "err", err)
	cancel()
	done := make(chan struct{})
	go func() {
		s.active.Wait()
		close(done)
	}()
	t := time.NewTimer(s.cfg.AbortGrace)
	select {
	case <-done:
	case <-t.C:
	}
	t.Stop()
	_ = srv.Close()
	return err
}

// Unready turns /health to 503 {"status":"draining"} and leaves every other route as it
// is: the lame-duck period before Shutdown, in which load balancers that follow /health
// stop routing to the server while the requests they still send are served.
func (s *Server) Unready() { s.unready.Store(true) }

// Draining reports whether Shutdown has begun.
func (s *Server) Draining() bool { return s.draining.Load() }

// ready returns the backend, or an error for 503 while loading or draining.
func (s *Server) ready() (*Backend, error) {
	if s.draining.Load() {
		return nil, fmt.Errorf("the server is shutting down: %w", openai.ErrNotReady)
	}
	b := s.backend.Load()
	if b == nil {
		return nil, fmt.Errorf("the model is still loading: %w", openai.ErrNotReady)
	}
	return b, nil
}

// get registers h for GET and for HEAD on path, as net/http's ServeMux does: load
// balancers and uptime checkers probe with HEAD, and RFC 9110 requires a server that
// answers GET to answer HEAD too (net/http drops the body of a HEAD response).
func get(r gin.IRoutes, path string, h gin.HandlerFunc) {
	r.GET(path, h)
	r.HEAD(path, h)
}

// routes builds the gin engine.
func (s *Server) routes() http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.HandleMethodNotAllowed = true
	// A path with a trailing slash is an unknown route (a 404 error object), not a
	// redirect that POST clients do not follow.
	r.RedirectTrailingSlash = false
	r.ContextWithFallback = true
	r.Use(s.requestLog, s.recoverPanic, s.limitBody)

	get(r, "/health", s.handleHealth)
	get(r, "/metrics", gin.WrapH(s.metrics.Handler()))
	if s.cfg.EnableWebUI {
		page := gin.WrapH(webui.Handler())
		get(r, "/", page)
		get(r, "/app.js", page)
		get(r, "/style.css", page)
	}

	authed := r.Group("/", s.requireKey)
	get(authed, "/v1/models", s.handleModels)
	get(authed, "/v1/models/*id", s.handleModel)
	get(authed, "/v1/engine/stats", s.handleEngineStats)
	authed.POST("/v1/completions", s.handleCompletions)
	authed.POST("/v1/chat/completions", s.handleChat)
	s.responseRoutes(authed)
	authed.POST("/tokenize", s.handleTokenize)
	authed.POST("/detokenize", s.handleDetokenize)

	r.NoRoute(func(c *gin.Context) {
		writeError(c.Writer, openai.Errorf(openai.ErrNotFound, "no route for %s %s", c.Request.Method, c.Request.URL.Path))
	})
	r.NoMethod(func(c *gin.Context) {
		writeError(c.Writer, openai.Errorf(openai.ErrMethodNotAllowed, "method %s is not allowed on %s", c.Request.Method, c.Request.URL.Path))
	})
	return r
}
