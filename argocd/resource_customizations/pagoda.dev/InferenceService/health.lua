-- Argo CD health check for pagoda.dev/InferenceService (Lua 5.1, as Argo CD's gopher-lua runs it).
-- The operator writes four conditions (Ready, Progressing, Degraded, DisruptionTolerant), each with
-- observedGeneration; health reads the first three (DisruptionTolerant=False is a risk, not a fault).
-- A condition written for an older metadata.generation says nothing about the current spec: until the
-- operator has observed the current generation, the service is Progressing.
local hs = {}

local function condition(conditions, kind)
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c ~= nil and c.reason ~= nil and c.reason ~= "" then
    return c.reason
  end
  return fallback
end

local generation = obj.metadata.generation or 0
local status = obj.status or {}
local conditions = status.conditions or {}

if #conditions == 0 then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

if status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local ready = condition(conditions, "Ready")
local progressing = condition(conditions, "Progressing")
local degraded = condition(conditions, "Degraded")

for _, c in ipairs(conditions) do
  if c.observedGeneration ~= nil and c.observedGeneration < generation then
    hs.status = "Progressing"
    hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
    return hs
  end
end

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded, "InferenceService is degraded")
  return hs
end

if ready ~= nil and ready.status == "True" then
  if progressing ~= nil and progressing.status == "True" then
    -- Serving, but a rollout is still going on (new pods coming up).
    hs.status = "Progressing"
    hs.message = describe(progressing, "Rollout in progress")
    return hs
  end
  hs.status = "Healthy"
  hs.message = describe(ready, "InferenceService is ready")
  return hs
end

if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(progressing, "Rollout in progress")
  return hs
end

if ready ~= nil and ready.status == "False" then
  -- Not ready and no longer making progress: the rollout is stuck.
  hs.status = "Degraded"
  hs.message = describe(ready, "InferenceService is not ready")
  return hs
end

hs.status = "Progressing"
hs.message = describe(ready, "Waiting for the InferenceService to become ready")
return hs
