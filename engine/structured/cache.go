package structured

import (
	"container/list"
	"fmt"
	"sync"
)

// A Cache compiles response formats into Constraints over one Vocabulary and keeps the
// most recently used ones, so that repeated requests with the same schema share its
// compiled grammar and the token masks computed so far. It is safe for concurrent use.
type Cache struct {
	vocab *Vocabulary
	max   int

	mu    sync.Mutex
	order *list.List // of *cacheEntry, most recent first
	byKey map[string]*list.Element
}

type cacheEntry struct {
	key string
	c   *Constraint
}

// NewCache returns a cache of at most max constraints over vocab.
func NewCache(vocab *Vocabulary, max int) *Cache {
	return &Cache{vocab: vocab, max: max, order: list.New(), byKey: map[string]*list.Element{}}
}

// JSONObject returns the constraint of response_format json_object.
func (c *Cache) JSONObject() *Constraint {
	con, _ := c.get("object", func() (*Grammar, error) { return CompileJSONObject(), nil })
	return con
}

// Schema returns the constraint of a json_schema response format (see CompileSchema).
func (c *Cache) Schema(schema []byte, strict bool) (*Constraint, error) {
	key := "schema:"
	if strict {
		key = "strict:"
	}
	return c.get(key+string(schema), func() (*Grammar, error) { return CompileSchema(schema, strict) })
}

func (c *Cache) get(key string, compile func() (*Grammar, error)) (*Constraint, error) {
	c.mu.Lock()
	if el, ok := c.byKey[key]; ok {
		c.order.MoveToFront(el)
		c.mu.Unlock()
		return el.Value.(*cacheEntry).c, nil
	}
	c.mu.Unlock()
	g, err := compile() // outside the lock: a large schema does not hold up the others
	if err != nil {
		return nil, err
	}
	con := NewConstraint(g, c.vocab)
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok { // compiled meanwhile by another request
		c.order.MoveToFront(el)
		return el.Value.(*cacheEntry).c, nil
	}
	c.byKey[key] = c.order.PushFront(&cacheEntry{key, con})
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.byKey, last.Value.(*cacheEntry).key)
	}
	return con, nil
}

// Wrapped returns the constraint of CompileWrapped's arguments.
func (c *Cache) Wrapped(prefix string, schema []byte, suffix, sep string, min, max int, strict bool) (*Constraint, error) {
	key := fmt.Sprintf("wrapped:%q %q %q %d %d %v:%s", prefix, suffix, sep, min, max, strict, schema)
	return c.get(key, func() (*Grammar, error) { return CompileWrapped(prefix, schema, suffix, sep, min, max, strict) })
}
